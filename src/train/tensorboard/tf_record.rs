//! TFRecord framing, the container of TensorBoard's event files. Each record is
//!
//! ```text
//!   u64 length (little-endian) │ u32 masked CRC32C of those 8 bytes │ data │ u32 masked CRC32C of data
//! ```
//!
//! CRC32C is CRC-32 with the Castagnoli polynomial (0x1EDC6F41, reflected 0x82F63B78), masked as
//! TensorFlow masks it: rotated right by 15 bits, plus 0xA282EAD8.

use anyhow::{bail, Result};

/// The Castagnoli polynomial, bit-reflected (the form a least-significant-bit-first table uses).
const CASTAGNOLI_REFLECTED: u32 = 0x82F6_3B78;

/// `TABLE[b]`: the CRC of byte `b` alone, eight shifts of the polynomial division at once.
const TABLE: [u32; 256] = crc_table();

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = byte as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ CASTAGNOLI_REFLECTED
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
}

/// CRC32C of `data` (initial value and final XOR all ones, as every CRC32C user computes it).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// TensorFlow's masked CRC32C: a CRC stored next to the data it covers is masked, so that the
/// CRC of bytes that themselves hold CRCs stays well distributed.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    crc32c(data).rotate_right(15).wrapping_add(0xA282_EAD8)
}

/// `data` as one framed record.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut record = Vec::with_capacity(data.len() + 16);
    record.extend_from_slice(&length);
    record.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    record.extend_from_slice(data);
    record.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    record
}

/// The records of a file's bytes, each with the offset it starts at.
#[derive(Debug, Default, PartialEq)]
pub struct Records<'a> {
    pub records: Vec<(usize, &'a [u8])>,
    /// Where an incomplete last record starts (a writer stopped while writing it), if any: the
    /// bytes from there on are not a record.
    pub torn_at: Option<usize>,
}

/// Splits `bytes` into records, checking both CRCs of each; a last record cut short is reported
/// in [`Records::torn_at`], any other damage is an error naming the byte offset.
pub fn records(bytes: &[u8]) -> Result<Records<'_>> {
    let mut out = Records::default();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < 12 {
            out.torn_at = Some(at);
            break;
        }
        let (length, rest) = rest.split_at(8);
        let length_crc = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
        if masked_crc32c(length) != length_crc {
            bail!("byte {at}: the record's length fails its checksum");
        }
        let length = u64::from_le_bytes(length.try_into().expect("8 bytes"));
        let rest = &rest[4..];
        let Some(data_len) = usize::try_from(length).ok().filter(|&n| n <= rest.len()) else {
            out.torn_at = Some(at);
            break;
        };
        if rest.len() < data_len + 4 {
            out.torn_at = Some(at);
            break;
        }
        let data = &rest[..data_len];
        let data_crc = u32::from_le_bytes(rest[data_len..data_len + 4].try_into().expect("4"));
        if masked_crc32c(data) != data_crc {
            bail!("byte {at}: the record's {data_len} bytes of data fail their checksum");
        }
        out.records.push((at, data));
        at += 16 + data_len;
    }
    Ok(out)
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

    #[test]
    fn crc32c_gives_the_standard_check_value() {
        // The check value of the CRC catalogue (CRC-32/ISCSI) and RFC 3720's test vectors.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn a_record_is_framed_as_tensorboards_own_writer_frames_it() {
        // tensorboard 2.21's RecordWriter (tensorboard.summary.writer.record_writer) writing the
        // serialised Event {wall_time: 1700000000.25, file_version: "brain.Event:2"}.
        let data = hex("0900001040fc54d9411a0d627261696e2e4576656e743a32");
        let expected = hex("1800000000000000a37f4b22\
             0900001040fc54d9411a0d627261696e2e4576656e743a32\
             338d2fe9");
        assert_eq!(frame(&data), expected);
        let read = records(&expected).unwrap();
        assert_eq!(read.records, vec![(0, data.as_slice())]);
        assert_eq!(read.torn_at, None);
    }

    #[test]
    fn reading_finds_every_record_a_torn_tail_and_damage() {
        let (a, b) = (b"first".as_slice(), vec![7u8; 300]);
        let mut file = frame(a);
        file.extend(frame(&b));
        let read = records(&file).unwrap();
        assert_eq!(read.records, vec![(0, a), (21, b.as_slice())]);
        // Every cut inside the second record leaves the first and reports the cut.
        for cut in 22..file.len() {
            let read = records(&file[..cut]).unwrap();
            assert_eq!(read.records, vec![(0, a)], "cut at {cut}");
            assert_eq!(read.torn_at, Some(21), "cut at {cut}");
        }
        assert!(records(&[]).unwrap().records.is_empty());
        let mut damaged = file.clone();
        damaged[21 + 12 + 5] ^= 1;
        let error = records(&damaged).unwrap_err().to_string();
        assert!(
            error.contains("byte 21") && error.contains("data"),
            "{error}"
        );
        damaged = file.clone();
        damaged[2] ^= 1;
        let error = records(&damaged).unwrap_err().to_string();
        assert!(
            error.contains("byte 0") && error.contains("length"),
            "{error}"
        );
    }
}
