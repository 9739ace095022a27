//! `swerve-bench kernels --static` (issue 36, no GPU needed): each kernel's resources as ptxas
//! reported them when the kernels were built (registers, spills, static shared memory), and, for
//! the kernels whose launch the host decides here (the paged attention variants), the blocks an
//! SM of an H100 / H200 holds and the bytes a decode configuration keeps in flight per SM, against
//! what the card's bandwidth-latency product asks for.
//!
//! Bytes in flight: a decode item keeps `stages - 1` K/V tiles (64 keys of K and of V) loading
//! while it computes one; an SM holds `blocks x items per block` items. Little's law: to stream
//! at bandwidth B with a loaded memory latency L, the SMs together need B x L bytes requested and
//! not yet arrived, `B L / SMs` each. L = 1 us here (600-900 ns measured under load on Hopper;
//! rounded up so that the check keeps a margin).

use crate::backend::cuda::embedded::PTXAS_REPORT;
use crate::backend::cuda::paged_attn::{
    attention_variant, split_decode_stages, split_decode_variant, warp_per_item_decode_variant,
    AttentionVariant, KEY_TILE,
};
use anyhow::Result;

/// The limits of one GPU that decide occupancy, and its memory bandwidth.
#[derive(Clone, Copy, Debug)]
pub struct Card {
    pub name: &'static str,
    pub sms: usize,
    pub regs_per_sm: usize,
    pub smem_per_sm: usize,
    /// The opt-in maximum of dynamic + static shared memory per block.
    pub smem_per_block: usize,
    /// Shared memory the system reserves per resident block.
    pub smem_reserved_per_block: usize,
    pub threads_per_sm: usize,
    pub blocks_per_sm: usize,
    /// DRAM bandwidth, bytes per second (the data sheet's).
    pub bandwidth: f64,
}

/// Loaded memory latency assumed by the bytes-in-flight check (module doc).
pub const LATENCY_S: f64 = 1e-6;

pub const H100: Card = Card {
    name: "H100 SXM",
    sms: 132,
    regs_per_sm: 65_536,
    smem_per_sm: 233_472,
    smem_per_block: 232_448,
    smem_reserved_per_block: 1024,
    threads_per_sm: 2048,
    blocks_per_sm: 32,
    bandwidth: 3.35e12,
};

pub const H200: Card = Card {
    name: "H200",
    bandwidth: 4.8e12,
    ..H100
};

impl Card {
    /// Bytes one SM must keep in flight to stream at the card's bandwidth.
    pub fn bytes_in_flight_needed(&self) -> f64 {
        self.bandwidth * LATENCY_S / self.sms as f64
    }
}

/// One kernel's resources on one architecture, from the ptxas report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxasEntry {
    pub function: String,
    pub arch: String,
    pub registers: usize,
    pub spill_bytes: usize,
    pub static_smem: usize,
    pub stack_bytes: usize,
}

/// The entries of a ptxas `-v` report (`build.rs` keeps it as `PTXAS_REPORT`).
pub fn parse_ptxas(report: &str) -> Vec<PtxasEntry> {
    let mut out: Vec<PtxasEntry> = Vec::new();
    let number_before = |line: &str, unit: &str| -> usize {
        line.split(unit)
            .next()
            .and_then(|head| head.split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let function = rest.split('\'').next().unwrap_or("").to_string();
            let arch = rest
                .split("for '")
                .nth(1)
                .unwrap_or("")
                .trim_end_matches('\'')
                .to_string();
            out.push(PtxasEntry {
                function,
                arch,
                ..PtxasEntry::default()
            });
        } else if let Some(entry) = out.last_mut() {
            if line.contains("bytes stack frame") {
                entry.stack_bytes = number_before(line, " bytes stack frame");
                entry.spill_bytes = number_before(line, " bytes spill stores")
                    + number_before(line, " bytes spill loads");
            } else if line.contains("Used ") && line.contains(" registers") {
                entry.registers = number_before(line, " registers");
                if line.contains(" bytes smem") {
                    entry.static_smem = number_before(line, " bytes smem");
                }
            }
        }
    }
    out
}

/// Resident blocks per SM of a launch of `threads` threads and `smem` bytes of shared memory
/// (dynamic + static), with `registers` per thread (0: unknown, not a limit).
pub fn blocks_per_sm(card: &Card, threads: usize, smem: usize, registers: usize) -> usize {
    let warps = threads.div_ceil(32);
    // Registers are allocated per warp in units of 256.
    let regs_per_warp = (registers * 32).div_ceil(256) * 256;
    let by_regs = if registers == 0 {
        usize::MAX
    } else {
        card.regs_per_sm / (regs_per_warp * warps).max(1)
    };
    let by_smem = if smem > card.smem_per_block {
        0
    } else {
        card.smem_per_sm / (smem + card.smem_reserved_per_block)
    };
    by_regs
        .min(by_smem)
        .min(card.threads_per_sm / threads.max(1))
        .min(card.blocks_per_sm)
}

/// One paged decode configuration on one card.
#[derive(Clone, Debug)]
pub struct DecodeOccupancy {
    pub variant: AttentionVariant,
    pub head_dim: usize,
    pub card: &'static str,
    pub registers: Option<usize>,
    pub blocks_per_sm: usize,
    pub bytes_in_flight: f64,
    pub bytes_needed: f64,
}

/// The decode configurations the engine runs at `head_dim` on `card` (the split kernel, its other
/// ring depths and the earlier one-warp-per-item kernel), with the registers of `entries` where
/// the report has them.
pub fn decode_occupancy(
    card: &'static Card,
    head_dim: usize,
    entries: &[PtxasEntry],
) -> Result<Vec<DecodeOccupancy>> {
    let engine = attention_variant(head_dim, false, card.smem_per_block)?;
    let mut variants = vec![
        engine.clone(),
        warp_per_item_decode_variant(head_dim, card.smem_per_block)?,
    ];
    for &stages in split_decode_stages(head_dim) {
        if stages != engine.stages {
            variants.push(split_decode_variant(head_dim, stages, card.smem_per_block)?);
        }
    }
    Ok(variants
        .into_iter()
        .map(|variant| {
            let entry = entries
                .iter()
                .find(|e| e.function == variant.name && e.arch.starts_with("sm_90"));
            let registers = entry.map(|e| e.registers);
            let smem = variant.smem as usize + entry.map_or(0, |e| e.static_smem);
            let blocks = blocks_per_sm(card, 32 * variant.warps, smem, registers.unwrap_or(0));
            let tile_bytes = 2 * KEY_TILE * head_dim * 2;
            let bytes_in_flight =
                (blocks * variant.items_per_block * (variant.stages - 1) * tile_bytes) as f64;
            DecodeOccupancy {
                variant,
                head_dim,
                card: card.name,
                registers,
                blocks_per_sm: blocks,
                bytes_in_flight,
                bytes_needed: card.bytes_in_flight_needed(),
            }
        })
        .collect())
}

/// Prints the report: every kernel's ptxas resources, then the decode configurations' occupancy
/// and bytes in flight on H100 and H200. Returns the decode rows (the CI check reads them).
pub fn print_static_report() -> Result<Vec<DecodeOccupancy>> {
    let entries = parse_ptxas(PTXAS_REPORT);
    if entries.is_empty() {
        println!("no ptxas report in this build (CPU-only or emulated: kernels not compiled by nvcc); registers unknown");
    } else {
        println!(
            "{:<44} {:<8} {:>5} {:>7} {:>7} {:>6}",
            "kernel", "arch", "regs", "spills", "smem", "stack"
        );
        for e in &entries {
            println!(
                "{:<44} {:<8} {:>5} {:>7} {:>7} {:>6}",
                e.function, e.arch, e.registers, e.spill_bytes, e.static_smem, e.stack_bytes
            );
        }
    }
    println!(
        "\n{:<34} {:>3} {:<9} {:>5} {:>7} {:>5} {:>6} {:>10} {:>10}",
        "decode configuration",
        "hd",
        "card",
        "regs",
        "smem",
        "warps",
        "blk/SM",
        "in flight",
        "needed"
    );
    let mut rows = Vec::new();
    for card in [&H100, &H200] {
        for head_dim in [64, 128] {
            for row in decode_occupancy(card, head_dim, &entries)? {
                println!(
                    "{:<34} {:>3} {:<9} {:>5} {:>7} {:>5} {:>6} {:>8.1}KB {:>8.1}KB{}",
                    row.variant.name,
                    row.head_dim,
                    row.card,
                    row.registers.map_or("?".to_string(), |r| r.to_string()),
                    row.variant.smem,
                    row.variant.warps,
                    row.blocks_per_sm,
                    row.bytes_in_flight / 1024.0,
                    row.bytes_needed / 1024.0,
                    if row.bytes_in_flight < row.bytes_needed {
                        "  (too few)"
                    } else {
                        ""
                    }
                );
                rows.push(row);
            }
        }
    }
    Ok(rows)
}
