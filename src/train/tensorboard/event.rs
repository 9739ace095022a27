//! The `Event` protocol buffer of TensorBoard's event files, the part scalars need, encoded and
//! decoded by hand (field numbers from tensorboard/compat/proto/event.proto and summary.proto):
//!
//! ```text
//! Event          1 wall_time double   2 step int64   3 file_version string   5 summary Summary
//! Summary        1 value repeated Summary.Value
//! Summary.Value  1 tag string         2 simple_value float
//! ```
//!
//! Encoded as proto3 serialisers do (fields in number order, a zero `wall_time` or `step` left
//! out), so the bytes equal what TensorBoard's own `SerializeToString` gives for the same event.

use anyhow::{bail, Context, Result};

/// One event, as far as scalars go.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: i64,
    pub what: What,
}

#[derive(Clone, Debug, PartialEq)]
pub enum What {
    /// The first event of a file: `brain.Event:2`.
    FileVersion(String),
    /// A summary of `simple_value` scalars, by tag. A value of another kind (an image, a tensor)
    /// decodes as `NaN` under its tag; swerve writes none.
    Scalars(Vec<(String, f32)>),
    /// Anything else (a graph, a session log): nothing swerve writes.
    Other,
}

/// Wire types of the protobuf encoding.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LENGTH_DELIMITED: u8 = 2;
const FIXED32: u8 = 5;

fn key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire_type)));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(out, field, LENGTH_DELIMITED);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `event`'s serialised bytes.
pub fn encode(event: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    if event.wall_time.to_bits() != 0 {
        key(&mut out, 1, FIXED64);
        out.extend_from_slice(&event.wall_time.to_le_bytes());
    }
    if event.step != 0 {
        key(&mut out, 2, VARINT);
        // int64: two's complement as a 64-bit varint.
        varint(&mut out, event.step as u64);
    }
    match &event.what {
        What::FileVersion(version) => bytes_field(&mut out, 3, version.as_bytes()),
        What::Scalars(values) => {
            let mut summary = Vec::new();
            for (tag, value) in values {
                let mut entry = Vec::new();
                bytes_field(&mut entry, 1, tag.as_bytes());
                key(&mut entry, 2, FIXED32);
                entry.extend_from_slice(&value.to_le_bytes());
                bytes_field(&mut summary, 1, &entry);
            }
            bytes_field(&mut out, 5, &summary);
        }
        What::Other => {}
    }
    out
}

/// A decoded field: its number and value.
enum Field<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// The fields of one message, in order.
fn fields(mut bytes: &[u8]) -> Result<Vec<(u64, Field<'_>)>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = read_varint(&mut bytes)?;
        let field = key >> 3;
        let value = match (key & 7) as u8 {
            VARINT => Field::Varint(read_varint(&mut bytes)?),
            FIXED64 => Field::Fixed64(take(&mut bytes, 8)?.try_into().expect("8 bytes")),
            LENGTH_DELIMITED => {
                let n = usize::try_from(read_varint(&mut bytes)?).context("a field's length")?;
                Field::Bytes(take(&mut bytes, n)?)
            }
            FIXED32 => Field::Fixed32(take(&mut bytes, 4)?.try_into().expect("4 bytes")),
            other => bail!("field {field} has wire type {other}, which events do not use"),
        };
        out.push((field, value));
    }
    Ok(out)
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if bytes.len() < n {
        bail!("a field runs past the end of its message");
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

fn read_varint(bytes: &mut &[u8]) -> Result<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let &[byte, ..] = *bytes else {
            bail!("a varint runs past the end of its message");
        };
        *bytes = &bytes[1..];
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    bail!("a varint longer than 10 bytes")
}

/// Decodes an event's bytes (unknown fields are skipped, as protobuf readers skip them).
pub fn decode(bytes: &[u8]) -> Result<Event> {
    let mut event = Event {
        wall_time: 0.0,
        step: 0,
        what: What::Other,
    };
    for (number, field) in fields(bytes)? {
        match (number, field) {
            (1, Field::Fixed64(b)) => event.wall_time = f64::from_le_bytes(b),
            (2, Field::Varint(v)) => event.step = v as i64,
            (3, Field::Bytes(b)) => {
                let version = std::str::from_utf8(b).context("file_version is not UTF-8")?;
                event.what = What::FileVersion(version.to_string());
            }
            (5, Field::Bytes(b)) => event.what = What::Scalars(summary_values(b)?),
            (4 | 6..=9, _) => event.what = What::Other,
            _ => {}
        }
    }
    Ok(event)
}

/// A summary's (tag, simple_value) pairs.
fn summary_values(bytes: &[u8]) -> Result<Vec<(String, f32)>> {
    let mut values = Vec::new();
    for (number, field) in fields(bytes)? {
        let (1, Field::Bytes(entry)) = (number, field) else {
            continue;
        };
        let (mut tag, mut value) = (String::new(), f32::NAN);
        for (number, field) in fields(entry)? {
            match (number, field) {
                (1, Field::Bytes(b)) => {
                    tag = std::str::from_utf8(b).context("a tag is not UTF-8")?.into()
                }
                (2, Field::Fixed32(b)) => value = f32::from_le_bytes(b),
                _ => {}
            }
        }
        values.push((tag, value));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Bytes from tensorboard 2.21's `event_pb2.Event(...).SerializeToString()`.
    #[test]
    fn events_encode_as_tensorboards_protobuf_classes_serialise_them() {
        let file_version = Event {
            wall_time: 1_700_000_000.25,
            step: 0,
            what: What::FileVersion("brain.Event:2".into()),
        };
        let expected = hex("0900001040fc54d9411a0d627261696e2e4576656e743a32");
        assert_eq!(encode(&file_version), expected);
        assert_eq!(decode(&expected).unwrap(), file_version);
        let scalars = Event {
            wall_time: 1_700_000_001.5,
            step: 300,
            what: What::Scalars(vec![
                ("metrics/loss".into(), 1.5),
                ("metrics/time_s/rollout".into(), -0.0),
            ]),
        };
        let expected = hex(
            "0900006040fc54d94110ac022a340a130a0c6d6574726963732f6c6f7373150000c03f0a1d0a16\
             6d6574726963732f74696d655f732f726f6c6c6f75741500000080",
        );
        assert_eq!(encode(&scalars), expected);
        let decoded = decode(&expected).unwrap();
        assert_eq!(decoded.step, 300);
        let What::Scalars(values) = decoded.what else {
            panic!("{decoded:?}")
        };
        assert_eq!(values[1].1.to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn non_finite_values_and_large_steps_round_trip() {
        let event = Event {
            wall_time: 1.0,
            step: (1 << 40) + 3,
            what: What::Scalars(vec![
                ("a".into(), f32::INFINITY),
                ("b".into(), f32::NEG_INFINITY),
                ("c".into(), f32::MAX),
            ]),
        };
        assert_eq!(decode(&encode(&event)).unwrap(), event);
        let nan = Event {
            what: What::Scalars(vec![("n".into(), f32::NAN)]),
            ..event
        };
        let What::Scalars(values) = decode(&encode(&nan)).unwrap().what else {
            panic!()
        };
        assert!(values[0].1.is_nan());
    }

    #[test]
    fn damaged_events_are_errors() {
        let bytes = encode(&Event {
            wall_time: 2.0,
            step: 5,
            what: What::Scalars(vec![("loss".into(), 1.0)]),
        });
        // A cut between fields leaves a shorter message (wall_time alone, or with the step);
        // any other cut breaks a field.
        for cut in 1..bytes.len() {
            let between_fields = cut == 9 || cut == 11;
            assert_eq!(
                decode(&bytes[..cut]).is_ok(),
                between_fields,
                "cut at {cut}"
            );
        }
        assert!(decode(&[0x0b]).is_err()); // wire type 3 (a group)
        assert!(decode(&[0x10; 11]).is_err()); // an endless varint
    }
}
