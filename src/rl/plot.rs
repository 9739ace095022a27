//! The RL run at a glance: `reward.png` (reward and resolved rate per iteration above, mean
//! turns below), rewritten after every iteration, and a one-line sparkline for the terminal.
//! A small PNG writer (stored deflate blocks, CRC-32, Adler-32) and a 3x5 pixel font, so the
//! plot costs no dependency.

use anyhow::{Context, Result};
use serde_json::Value;
use std::path::Path;

const WIDTH: usize = 640;
const HEIGHT: usize = 420;
const MARGIN_LEFT: usize = 44;
const MARGIN_RIGHT: usize = 12;
const REWARD_COLOR: [u8; 3] = [31, 119, 180];
const RESOLVED_COLOR: [u8; 3] = [44, 160, 44];
const TURNS_COLOR: [u8; 3] = [214, 39, 40];
const AXIS: [u8; 3] = [90, 90, 90];
const GRID: [u8; 3] = [225, 225, 225];

struct Canvas {
    pixels: Vec<u8>,
}

impl Canvas {
    fn new() -> Self {
        Self {
            pixels: vec![255; WIDTH * HEIGHT * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, color: [u8; 3]) {
        if (0..WIDTH as i64).contains(&x) && (0..HEIGHT as i64).contains(&y) {
            let i = (y as usize * WIDTH + x as usize) * 3;
            self.pixels[i..i + 3].copy_from_slice(&color);
        }
    }

    /// A line two pixels thick (Bresenham).
    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), color: [u8; 3], thick: bool) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.set(x, y, color);
            if thick {
                self.set(x, y + 1, color);
                self.set(x + 1, y, color);
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Text in the 3x5 font at `scale` pixels per font pixel; unknown characters are blank.
    fn text(&mut self, x: i64, y: i64, text: &str, color: [u8; 3], scale: i64) {
        for (i, c) in text.chars().enumerate() {
            let bits = glyph(c);
            for row in 0..5 {
                for col in 0..3 {
                    if bits >> (14 - (row * 3 + col)) & 1 == 1 {
                        for dy in 0..scale {
                            for dx in 0..scale {
                                self.set(
                                    x + (i as i64 * 4 + col) * scale + dx,
                                    y + row * scale + dy,
                                    color,
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// 3x5 glyphs, row-major from the top-left, 15 bits.
fn glyph(c: char) -> u16 {
    match c.to_ascii_lowercase() {
        '0' => 0b111_101_101_101_111,
        '1' => 0b010_110_010_010_111,
        '2' => 0b111_001_111_100_111,
        '3' => 0b111_001_111_001_111,
        '4' => 0b101_101_111_001_001,
        '5' => 0b111_100_111_001_111,
        '6' => 0b111_100_111_101_111,
        '7' => 0b111_001_010_010_010,
        '8' => 0b111_101_111_101_111,
        '9' => 0b111_101_111_001_111,
        '.' => 0b000_000_000_000_010,
        '-' => 0b000_000_111_000_000,
        'a' => 0b010_101_111_101_101,
        'd' => 0b110_101_101_101_110,
        'e' => 0b111_100_110_100_111,
        'i' => 0b111_010_010_010_111,
        'l' => 0b100_100_100_100_111,
        'm' => 0b101_111_111_101_101,
        'n' => 0b110_101_101_101_101,
        'o' => 0b111_101_101_101_111,
        'r' => 0b110_101_110_101_101,
        's' => 0b111_100_111_001_111,
        't' => 0b111_010_010_010_010,
        'u' => 0b101_101_101_101_111,
        'v' => 0b101_101_101_101_010,
        'w' => 0b101_101_111_111_101,
        _ => 0,
    }
}

fn series(history: &[Value], key: &str) -> Vec<(f64, f64)> {
    history
        .iter()
        .filter(|l| l["phase"] != "rft")
        .filter_map(|l| Some((l["iteration"].as_f64()?, l[key].as_f64()?)))
        .collect()
}

/// A series of (iteration, value) points and its color.
type Line<'a> = (&'a [(f64, f64)], [u8; 3]);

/// One panel: `lines` plotted over iterations between `lo` and `hi`, in `top..bottom`.
fn panel(
    canvas: &mut Canvas,
    lines: &[Line<'_>],
    (lo, hi): (f64, f64),
    (top, bottom): (usize, usize),
    max_iteration: f64,
) {
    let (left, right) = (MARGIN_LEFT as i64, (WIDTH - MARGIN_RIGHT) as i64);
    let (top, bottom) = (top as i64, bottom as i64);
    let x_of = |it: f64| {
        left + ((it - 1.0) / (max_iteration - 1.0).max(1.0) * (right - left) as f64) as i64
    };
    let y_of = |v: f64| bottom - ((v - lo) / (hi - lo) * (bottom - top) as f64).round() as i64;
    for k in 0..=4 {
        let v = lo + (hi - lo) * k as f64 / 4.0;
        let y = y_of(v);
        canvas.line((left, y), (right, y), GRID, false);
        canvas.text(2, y - 2, &format!("{v:.2}"), AXIS, 1);
    }
    canvas.line((left, top), (left, bottom), AXIS, false);
    canvas.line((left, bottom), (right, bottom), AXIS, false);
    for (points, color) in lines {
        for w in points.windows(2) {
            canvas.line(
                (x_of(w[0].0), y_of(w[0].1)),
                (x_of(w[1].0), y_of(w[1].1)),
                *color,
                true,
            );
        }
        if let [only] = points {
            canvas.line(
                (x_of(only.0), y_of(only.1)),
                (x_of(only.0) + 1, y_of(only.1)),
                *color,
                true,
            );
        }
    }
}

/// Writes the plot of `history` (lines of `iterations.jsonl`) to `path`.
pub fn write_reward_plot(path: &Path, history: &[Value]) -> Result<()> {
    let reward = series(history, "mean_reward");
    let resolved = series(history, "resolved_rate");
    let turns = series(history, "mean_turns");
    let max_iteration = reward.iter().map(|p| p.0).fold(1.0, f64::max);
    let mut canvas = Canvas::new();
    canvas.text(MARGIN_LEFT as i64, 6, "reward", REWARD_COLOR, 2);
    canvas.text(
        MARGIN_LEFT as i64 + 60,
        6,
        "resolved rate",
        RESOLVED_COLOR,
        2,
    );
    canvas.text(MARGIN_LEFT as i64 + 176, 6, "mean turns", TURNS_COLOR, 2);
    let low = reward
        .iter()
        .map(|p| p.1)
        .fold(0.0f64, f64::min)
        .floor()
        .max(-2.0);
    panel(
        &mut canvas,
        &[(&reward, REWARD_COLOR), (&resolved, RESOLVED_COLOR)],
        (low, 1.0),
        (24, 250),
        max_iteration,
    );
    let most_turns = turns.iter().map(|p| p.1).fold(1.0f64, f64::max).ceil();
    panel(
        &mut canvas,
        &[(&turns, TURNS_COLOR)],
        (0.0, most_turns),
        (270, 390),
        max_iteration,
    );
    canvas.text(WIDTH as i64 / 2 - 36, 402, "iteration", AXIS, 2);
    canvas.text(MARGIN_LEFT as i64, 402, "1", AXIS, 2);
    canvas.text(
        WIDTH as i64 - 40,
        402,
        &format!("{}", max_iteration as u64),
        AXIS,
        2,
    );
    let png = encode_png(WIDTH, HEIGHT, &canvas.pixels);
    let partial = path.with_extension("png.partial");
    std::fs::write(&partial, png).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))
}

/// `reward ▁▂▃▅▇ resolved ...` over the last 40 iterations.
pub fn sparkline(history: &[Value]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let line = |key: &str, lo: f64, hi: f64| -> String {
        let points = series(history, key);
        let start = points.len().saturating_sub(40);
        points[start..]
            .iter()
            .map(|p| BARS[(((p.1 - lo) / (hi - lo)).clamp(0.0, 1.0) * 7.0).round() as usize])
            .collect()
    };
    format!(
        "reward {}  resolved {}",
        line("mean_reward", -1.0, 1.0),
        line("resolved_rate", 0.0, 1.0)
    )
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in bytes {
        a = (a + x as u32) % 65_521;
        b = (b + a) % 65_521;
    }
    (b << 16) | a
}

/// An RGB8 PNG with uncompressed (stored) deflate blocks.
pub fn encode_png(width: usize, height: usize, rgb: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(height * (width * 3 + 1));
    for row in rgb.chunks(width * 3) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut zlib = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        zlib.push((i + 1 == blocks.len()) as u8);
        let len = block.len() as u16;
        zlib.extend_from_slice(&len.to_le_bytes());
        zlib.extend_from_slice(&(!len).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    zlib.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut png = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    let mut chunk = |kind: &[u8; 4], data: &[u8]| {
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        png.extend_from_slice(&body);
        png.extend_from_slice(&crc32(&body).to_be_bytes());
    };
    let mut header = Vec::new();
    header.extend_from_slice(&(width as u32).to_be_bytes());
    header.extend_from_slice(&(height as u32).to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, deflate, no filter, no interlace
    chunk(b"IHDR", &header);
    chunk(b"IDAT", &zlib);
    chunk(b"IEND", &[]);
    png
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_known_values() {
        assert_eq!(crc32(b"IEND"), 0xAE42_6082);
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }

    #[test]
    fn plot_is_a_png_with_the_series_drawn() {
        let history: Vec<Value> = (1..=5)
            .map(|i| serde_json::json!({"iteration": i, "phase": "dapo", "mean_reward": i as f64 / 5.0 - 0.5, "resolved_rate": i as f64 / 5.0, "mean_turns": 6.0 - i as f64}))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reward.png");
        write_reward_plot(&path, &history).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(
            bytes.len(),
            8 + 25
                + (12
                    + 2
                    + (HEIGHT * (WIDTH * 3 + 1)).div_ceil(65_535) * 5
                    + HEIGHT * (WIDTH * 3 + 1)
                    + 4)
                + 12
        );
        assert!(sparkline(&history).starts_with("reward "));
    }
}
