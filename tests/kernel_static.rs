//! Issue 36, item 4, without a GPU: the decode configurations keep enough bytes in flight per SM
//! on an H100 and an H200 (Little's law with a 1 us loaded latency: `swerve-bench kernels
//! --static`), with the registers ptxas reported when the kernels were built (CI builds them with
//! nvcc; a CPU-only build checks shared memory alone), and the check itself can fail.

use swerve::bench::kernel_static::{blocks_per_sm, decode_occupancy, parse_ptxas, H100, H200};

#[test]
fn decode_configurations_keep_enough_bytes_in_flight() {
    let entries = parse_ptxas(swerve::backend::cuda::embedded::PTXAS_REPORT);
    for card in [&H100, &H200] {
        for head_dim in [64, 128] {
            let rows = decode_occupancy(card, head_dim, &entries).unwrap();
            let split = &rows[0];
            assert!(split.variant.name.contains("split"), "{:?}", split.variant);
            assert!(
                split.bytes_in_flight >= split.bytes_needed,
                "{} hd {head_dim} on {}: {} blocks per SM keep {:.0} B in flight, {:.0} needed",
                split.variant.name,
                card.name,
                split.blocks_per_sm,
                split.bytes_in_flight,
                split.bytes_needed
            );
            if !entries.is_empty() {
                assert!(
                    split.registers.is_some(),
                    "no ptxas entry for {}",
                    split.variant.name
                );
            }
        }
    }
}

#[test]
fn the_occupancy_arithmetic_and_the_check_can_fail() {
    // 128 threads, 83,200 B: shared memory allows 2 blocks (2 x 84,224 <= 233,472).
    assert_eq!(blocks_per_sm(&H100, 128, 83_200, 0), 2);
    // 139 registers round to 144 per thread (a warp's 4,608 in units of 256): 65,536 /
    // (4,608 x 4 warps) = 3 blocks; shared memory still limits to 2.
    assert_eq!(blocks_per_sm(&H100, 128, 0, 139), 3);
    assert_eq!(blocks_per_sm(&H100, 128, 83_200, 139), 2);
    // Over the per-block limit: no block at all.
    assert_eq!(blocks_per_sm(&H100, 128, 240_000, 0), 0);
    // A split configuration with a 3-stage ring (118 KB) would hold 1 block an SM: one tile ahead,
    // 32 KB in flight, too few for an H200's 36 KB.
    let one_block = blocks_per_sm(&H200, 128, 118_016, 139);
    assert_eq!(one_block, 1);
    let in_flight = (one_block * 2 * 64 * 128 * 2) as f64;
    assert!(in_flight < H200.bytes_in_flight_needed());
}

#[test]
fn the_ptxas_report_parses() {
    let report =
        "ptxas info    : Compiling entry function 'paged_attn_decode_split_hd128' for 'sm_90a'\n\
                  ptxas info    : Function properties for paged_attn_decode_split_hd128\n    \
                  8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
                  ptxas info    : Used 139 registers, used 1 barriers, 40 bytes smem\n";
    let entries = parse_ptxas(report);
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!(
        (e.function.as_str(), e.arch.as_str()),
        ("paged_attn_decode_split_hd128", "sm_90a")
    );
    assert_eq!(
        (e.registers, e.spill_bytes, e.static_smem, e.stack_bytes),
        (139, 8, 40, 8)
    );
}
