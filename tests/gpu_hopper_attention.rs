//! The sm_90a attention forward (`kernels/flash_attn_sm90.cu`: TMA loads on mbarriers, wgmma
//! from swizzled shared memory, a producer warp and two consumer warpgroups) gives the portable
//! forward's bits (`kernels/flash_attn.cu`, mma.sync), output and logsumexp, for every head dim
//! it has (16, 32, 64, 128), GQA 1 to 4, sequences that end inside a tile, on a tile or segment
//! boundary, packed beside each other (a key tile then reaches into the next sequence) and past
//! the end of the tensor (the TMA's zero fill). Since the portable forward equals the engine's
//! decode and prefill bit for bit (tests/gpu_exact_attention.rs), so does this one. Compared as
//! f32 bits, no tolerance; both also against f64 attention on sampled rows, so that two equal
//! wrong answers cannot pass.
//!
//! Needs compute capability 9.x (an H100 / H200, or the emulated device's default sm_90): on
//! another GPU the test checks that the sm_90a kernels are refused, by name, and stops there.

mod common;

use common::gpu::{attention_row_f64, gpu, poisoned, random};
use swerve::backend::cuda::flash_attn::VarlenLayout;
use swerve::backend::cuda::{CudaBackend, CudaTensor, DeviceDType};
use swerve::backend::Backend;

/// (heads, kv_heads, head_dim).
type Heads = (usize, usize, usize);

struct Run {
    out: Vec<u32>,
    lse: Vec<u32>,
    out_f32: Vec<f32>,
}

#[allow(clippy::too_many_arguments)]
fn forward(
    gpu: &CudaBackend,
    hopper: bool,
    (q, k, v): (&CudaTensor, &CudaTensor, &CudaTensor),
    layout: &VarlenLayout,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
) -> Run {
    let t = layout.total_tokens();
    gpu.device.set_hopper_attention(hopper).unwrap();
    let mut out = poisoned(gpu, &[t, heads, head_dim], DeviceDType::Bf16);
    let mut lse = poisoned(gpu, &[t, heads], DeviceDType::F32);
    gpu.device
        .flash_attn_fwd(q, k, v, layout, heads, kv_heads, scale, &mut out, &mut lse)
        .unwrap();
    let out_f32 = gpu.to_host(&out).unwrap();
    Run {
        out: out_f32.iter().map(|x| x.to_bits()).collect(),
        lse: gpu
            .to_host(&lse)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
        out_f32,
    }
}

/// Against f64 attention on sampled rows (first, last, tile and segment edges of each sequence):
/// bf16 outputs (half an ulp: 2^-9 relative) of bf16-rounded P, within 1e-2 relative.
fn check_sampled_rows(
    what: &str,
    out: &[f32],
    (q, k, v): (&[f32], &[f32], &[f32]),
    lens: &[usize],
    (heads, kv_heads, head_dim): (usize, usize, usize),
) {
    let mut start = 0;
    for &len in lens {
        for pos in [0, 1, 63, 64, 511, 512, len / 2, len - 1] {
            let row = start + pos.min(len - 1);
            for h in [0, heads - 1] {
                let g = h / (heads / kv_heads);
                let keys = (start..=row).map(|j| (j * kv_heads + g) * head_dim);
                let query = &q[(row * heads + h) * head_dim..][..head_dim];
                let want = attention_row_f64(query, k, v, keys);
                let got = &out[(row * heads + h) * head_dim..][..head_dim];
                for (d, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-2 * (1.0 + w.abs()),
                        "{what}: token {row} head {h} dim {d}: {g} against f64 {w}"
                    );
                }
            }
        }
        start += len;
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn the_hopper_forward_gives_the_portable_forwards_bits() {
    let gpu = gpu();
    let (major, minor) = gpu.device.compute_capability;
    if major != 9 {
        let err = gpu
            .device
            .set_hopper_attention(true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("compute capability 9.x"), "{err}");
        eprintln!("compute capability {major}.{minor}: no sm_90a kernels to compare");
        return;
    }
    // (heads, kv_heads, head_dim), sequence lengths.
    let cases: [(Heads, &[usize]); 4] = [
        ((8, 2, 128), &[1, 64, 65, 130, 520, 1100]),
        ((4, 4, 64), &[513, 7, 200]),
        ((4, 1, 32), &[300, 1024, 33]),
        ((2, 2, 16), &[129, 64, 700]),
    ];
    for (seed, ((heads, kv_heads, head_dim), lens)) in cases.into_iter().enumerate() {
        let seed = 100 + 10 * seed as u64;
        let total: usize = lens.iter().sum();
        let (q, qh) = random(&gpu, &[total, heads, head_dim], seed, 2.0);
        let (k, kh) = random(&gpu, &[total, kv_heads, head_dim], seed + 1, 2.0);
        let (v, vh) = random(&gpu, &[total, kv_heads, head_dim], seed + 2, 1.0);
        let mut cu = vec![0u32];
        for &l in lens {
            cu.push(cu.last().unwrap() + l as u32);
        }
        let layout = VarlenLayout::upload(&gpu, &cu).unwrap();
        // attention_row_f64's scale.
        let scale = 1.0 / (head_dim as f32).sqrt();
        let operands = (&q, &k, &v);
        let portable = forward(
            &gpu, false, operands, &layout, heads, kv_heads, head_dim, scale,
        );
        let hopper = forward(
            &gpu, true, operands, &layout, heads, kv_heads, head_dim, scale,
        );
        let kernel = format!("flash_attn_fwd_sm90_hd{head_dim}");
        let what = format!("{kernel}: heads {heads}/{kv_heads}, lens {lens:?}");
        if let Some(i) = (0..hopper.out.len()).find(|&i| hopper.out[i] != portable.out[i]) {
            let (row, h) = (i / (heads * head_dim), i / head_dim % heads);
            panic!(
                "{what}: output element {i} (token {row}, head {h}) is {:#010x} on sm_90a and \
                 {:#010x} on the portable kernel",
                hopper.out[i], portable.out[i]
            );
        }
        assert_eq!(hopper.lse, portable.lse, "{what}: logsumexp bits differ");
        check_sampled_rows(
            &what,
            &hopper.out_f32,
            (&qh.data, &kh.data, &vh.data),
            lens,
            (heads, kv_heads, head_dim),
        );
    }
    gpu.device.set_hopper_attention(true).unwrap();
}
