//! The paged KV cache's writes and attention over what they wrote (kernels/paged_attn.cu):
//! `write_kv` bit for bit into shuffled slots, and paged attention over caches `write_kv` filled
//! equal to the prefill flash kernel (kernels/flash_attn.cu) over the same packed prompts, whole
//! in one step and as a chunk over a cached prefix. Caches and outputs are poisoned (NaN bytes)
//! before each launch; the tolerance is tests/gpu_paged.rs's, row by row.
//!
//! The GPU tests need a CUDA GPU: run them through scripts/gpu-pack.sh; without one they fail,
//! never pass (or a SWERVE_EMU=1 build runs them on the emulated device).

mod common;

use common::gpu::{
    attention_f64, check_within_naive, gpu, naive_attention, poisoned, random, Rows,
};
use common::paged::{shuffle, shuffled_layout, Heads};
use half::bf16;
use swerve::backend::cpu::{CpuBackend, CpuTensor};
use swerve::backend::cuda::backend::pod_vec;
use swerve::backend::cuda::{CudaBackend, CudaTensor, DeviceDType};
use swerve::backend::{Backend, PagedLayout};
use swerve::bench::kernels::max_abs_diff;

/// Two kernels computing the same attention differ by at most twice the naive error.
fn check_kernels_agree(what: &str, a: &[f32], b: &[f32], naive_err: f32) {
    assert_eq!(a.len(), b.len(), "{what}: output size");
    let diff = max_abs_diff(a, b);
    println!("{what}: difference {diff:.3e}, naive error {naive_err:.3e}");
    assert!(
        naive_err > 0.0 && diff <= 2.0 * naive_err,
        "{what}: kernels differ by {diff} > 2 x naive {naive_err}"
    );
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn write_kv_copies_rows_bitwise_into_shuffled_slots() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(tokens, kv_heads, hd, bs)) in [
        (1usize, 1usize, 64usize, 16usize),
        (7, 2, 128, 16),
        (4099, 2, 128, 16),
        (129, 3, 16, 7),
        (33, 4, 32, 1),
    ]
    .iter()
    .enumerate()
    {
        let num_blocks = tokens.div_ceil(bs) * 2 + 1;
        let mut slots: Vec<u32> = (0..(num_blocks * bs) as u32).collect();
        shuffle(&mut slots, 40 + i as u64);
        slots.truncate(tokens);
        let seed = 2000 + 10 * i as u64;
        let (k, k_cpu) = random(&gpu, &[tokens, kv_heads, hd], seed, 2.0);
        let (v, v_cpu) = random(&gpu, &[tokens, kv_heads, hd], seed + 1, 1.0);
        let cache_shape = [num_blocks, bs, kv_heads, hd];
        let (mut k_cache, mut k_cache_cpu) = random(&gpu, &cache_shape, seed + 2, 3.0);
        let (mut v_cache, mut v_cache_cpu) = random(&gpu, &cache_shape, seed + 3, 3.0);
        gpu.write_kv(&k, &v, &slots, &mut k_cache, &mut v_cache)
            .unwrap();
        cpu.write_kv(&k_cpu, &v_cpu, &slots, &mut k_cache_cpu, &mut v_cache_cpu)
            .unwrap();
        // Every written slot holds its row, every other slot is untouched: bit for bit.
        for (name, dev, want) in [
            ("k_cache", &k_cache, &k_cache_cpu),
            ("v_cache", &v_cache, &v_cache_cpu),
        ] {
            let got: Vec<bf16> = pod_vec(&gpu.read_bytes(dev).unwrap());
            let want: Vec<bf16> = want.data.iter().map(|&x| bf16::from_f32(x)).collect();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} [{tokens}, {kv_heads}, {hd}] block size {bs}"
            );
        }
    }
}

/// Packs the rows `[from(s), to(s))` of each sequence (rows of `width` values) of a packed
/// tensor whose sequences start at `cu`.
fn pack_rows(
    data: &[f32],
    width: usize,
    cu: &[u32],
    range: impl Fn(usize) -> (usize, usize),
) -> Vec<f32> {
    let mut out = Vec::new();
    for (s, &start) in cu[..cu.len() - 1].iter().enumerate() {
        let (from, to) = range(s);
        let start = start as usize;
        out.extend_from_slice(&data[(start + from) * width..(start + to) * width]);
    }
    out
}

/// Attention of whole prompts over a cache `write_kv` filled equals the flash prefill kernel's:
/// in one step, and in two (the rest of each prompt as a chunk over its cached prefix).
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn paged_attention_over_written_cache_equals_flash_prefill() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let lens = [300usize, 1000, 17, 1, 129];
    let mut cu = vec![0u32];
    for &l in &lens {
        cu.push(cu.last().unwrap() + l as u32);
    }
    for (i, &heads) in [(8, 2, 128), (14, 2, 64), (4, 4, 16)].iter().enumerate() {
        let case = PrefillCase::new(&gpu, &cpu, &cu, heads, 6000 + 10 * i as u64);
        let (layout, num_blocks) = shuffled_layout(16, &lens, &lens, 400 + i as u64);
        case.check_one_step(&gpu, &layout, num_blocks);
        case.check_two_steps(&gpu, &layout, num_blocks, &lens);
    }
}

/// One prefill case: random q, k, v over packed prompts, the flash kernel's output, and the
/// references (the CPU backend's, checked here; naive bf16; f64).
struct PrefillCase {
    cu: Vec<u32>,
    heads: Heads,
    q: CudaTensor,
    k: CudaTensor,
    v: CudaTensor,
    q_cpu: CpuTensor,
    k_cpu: CpuTensor,
    v_cpu: CpuTensor,
    flash: Vec<f32>,
    reference: Vec<f32>,
    naive: Vec<f32>,
    exact: Vec<f32>,
    what: String,
}

impl PrefillCase {
    fn new(gpu: &CudaBackend, cpu: &CpuBackend, cu: &[u32], heads: Heads, seed: u64) -> Self {
        let (h, kv_heads, hd) = heads;
        let t = *cu.last().unwrap() as usize;
        let (q, q_cpu) = random(gpu, &[t, h, hd], seed, 2.0);
        let (k, k_cpu) = random(gpu, &[t, kv_heads, hd], seed + 1, 2.0);
        let (v, v_cpu) = random(gpu, &[t, kv_heads, hd], seed + 2, 1.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut flash = poisoned(gpu, &[t, h, hd], DeviceDType::Bf16);
        gpu.attention(&q, &k, &v, cu, scale, &mut flash).unwrap();
        let flash = gpu.to_host(&flash).unwrap();
        let mut reference = cpu.zeros(&[t, h, hd]).unwrap();
        cpu.attention(&q_cpu, &k_cpu, &v_cpu, cu, scale, &mut reference)
            .unwrap();
        let naive = naive_attention(&q_cpu.data, &k_cpu.data, &v_cpu.data, cu, h, kv_heads, hd);
        let what = format!("heads {h}/{kv_heads} hd {hd}");
        let exact = attention_f64(&q_cpu.data, &k_cpu.data, &v_cpu.data, cu, h, kv_heads, hd);
        check_within_naive(
            &format!("cpu prefill {what}"),
            &reference.data,
            &exact,
            &naive,
            Rows::heads(h, hd),
        );
        Self {
            cu: cu.to_vec(),
            heads,
            q,
            k,
            v,
            q_cpu,
            k_cpu,
            v_cpu,
            flash,
            reference: reference.data,
            naive,
            exact,
            what,
        }
    }

    fn scale(&self) -> f32 {
        1.0 / (self.heads.2 as f32).sqrt()
    }

    fn cache_shape(&self, num_blocks: usize) -> [usize; 4] {
        [num_blocks, 16, self.heads.1, self.heads.2]
    }

    /// Whole prompts in one step: every row of every sequence, over NaN-poisoned caches (a read
    /// of any slot not written here would show).
    fn check_one_step(&self, gpu: &CudaBackend, layout: &PagedLayout, num_blocks: usize) {
        let (heads, _, hd) = self.heads;
        let t = *self.cu.last().unwrap() as usize;
        let cache_shape = self.cache_shape(num_blocks);
        let mut k_cache = poisoned(gpu, &cache_shape, DeviceDType::Bf16);
        let mut v_cache = poisoned(gpu, &cache_shape, DeviceDType::Bf16);
        gpu.write_kv(
            &self.k,
            &self.v,
            &layout.slot_mapping,
            &mut k_cache,
            &mut v_cache,
        )
        .unwrap();
        let mut out = poisoned(gpu, &[t, heads, hd], DeviceDType::Bf16);
        gpu.paged_attention(&self.q, &k_cache, &v_cache, layout, self.scale(), &mut out)
            .unwrap();
        let paged = gpu.to_host(&out).unwrap();
        let (what, rows) = (&self.what, Rows::heads(heads, hd));
        check_within_naive(
            &format!("paged prefill {what}"),
            &paged,
            &self.exact,
            &self.naive,
            rows,
        );
        check_within_naive(
            &format!("flash prefill {what}"),
            &self.flash,
            &self.exact,
            &self.naive,
            rows,
        );
        check_kernels_agree(
            &format!("paged vs flash {what}"),
            &paged,
            &self.flash,
            max_abs_diff(&self.naive, &self.reference),
        );
    }

    /// Two steps: the first 60% of each prompt, then the rest as a chunk over that prefix; the
    /// chunk's rows against the references' and the flash kernel's same rows.
    fn check_two_steps(
        &self,
        gpu: &CudaBackend,
        layout: &PagedLayout,
        num_blocks: usize,
        lens: &[usize],
    ) {
        let (heads, _, hd) = self.heads;
        let split = |s: usize| lens[s] * 3 / 5;
        let first: Vec<usize> = (0..lens.len()).map(split).collect();
        let rest: Vec<usize> = (0..lens.len()).map(|s| lens[s] - split(s)).collect();
        let cache_shape = self.cache_shape(num_blocks);
        let (mut k_cache, mut v_cache) = (
            poisoned(gpu, &cache_shape, DeviceDType::Bf16),
            poisoned(gpu, &cache_shape, DeviceDType::Bf16),
        );
        let mut chunk_out = Vec::new();
        for (step, (rows, contexts)) in [
            (first.clone(), first.clone()),
            (rest.clone(), lens.to_vec()),
        ]
        .into_iter()
        .enumerate()
        {
            let step_layout = step_layout(layout, &rows, &contexts);
            if step_layout.num_query_rows() == 0 {
                continue;
            }
            let range = |s: usize| (contexts[s] - rows[s], contexts[s]);
            let out = self.run_step(gpu, &step_layout, range, &mut k_cache, &mut v_cache);
            if step == 1 {
                chunk_out = out;
            }
        }
        let rest_range = |s: usize| (split(s), lens[s]);
        let (cu, width) = (&self.cu, heads * hd);
        let reference_rest = pack_rows(&self.reference, width, cu, rest_range);
        let exact_rest = pack_rows(&self.exact, width, cu, rest_range);
        let flash_rest = pack_rows(&self.flash, width, cu, rest_range);
        let naive_rest = pack_rows(&self.naive, width, cu, rest_range);
        let what = &self.what;
        check_within_naive(
            &format!("paged chunk after a cached prefix {what}"),
            &chunk_out,
            &exact_rest,
            &naive_rest,
            Rows::heads(heads, hd),
        );
        check_kernels_agree(
            &format!("paged chunk vs flash {what}"),
            &chunk_out,
            &flash_rest,
            max_abs_diff(&naive_rest, &reference_rest),
        );
    }

    /// One step of [`Self::check_two_steps`]: each sequence's rows `range(s)` written into the
    /// caches, then attended over them; the output.
    fn run_step(
        &self,
        gpu: &CudaBackend,
        step_layout: &PagedLayout,
        range: impl Fn(usize) -> (usize, usize) + Copy,
        k_cache: &mut CudaTensor,
        v_cache: &mut CudaTensor,
    ) -> Vec<f32> {
        let (heads, kv_heads, hd) = self.heads;
        let n = step_layout.num_query_rows();
        let upload = |data: &[f32], width: usize, shape: &[usize]| {
            let values: Vec<bf16> = pack_rows(data, width, &self.cu, range)
                .iter()
                .map(|&x| bf16::from_f32(x))
                .collect();
            gpu.upload_pod(&values, shape, DeviceDType::Bf16).unwrap()
        };
        let kw = kv_heads * hd;
        let step_k = upload(&self.k_cpu.data, kw, &[n, kv_heads, hd]);
        let step_v = upload(&self.v_cpu.data, kw, &[n, kv_heads, hd]);
        let step_q = upload(&self.q_cpu.data, heads * hd, &[n, heads, hd]);
        gpu.write_kv(
            &step_k,
            &step_v,
            &step_layout.slot_mapping,
            k_cache,
            v_cache,
        )
        .unwrap();
        let mut out = poisoned(gpu, &[n, heads, hd], DeviceDType::Bf16);
        gpu.paged_attention(
            &step_q,
            k_cache,
            v_cache,
            step_layout,
            self.scale(),
            &mut out,
        )
        .unwrap();
        gpu.to_host(&out).unwrap()
    }
}

/// `layout`'s block tables with `rows[s]` query rows ending at context `contexts[s]` (blocks of
/// 16), and their slots.
fn step_layout(layout: &PagedLayout, rows: &[usize], contexts: &[usize]) -> PagedLayout {
    let mut step_layout = layout.clone();
    step_layout.context_lens = contexts.iter().map(|&c| c as u32).collect();
    step_layout.cu_query = vec![0];
    step_layout.slot_mapping.clear();
    for (s, (&n, &c)) in rows.iter().zip(contexts).enumerate() {
        step_layout
            .cu_query
            .push(step_layout.cu_query.last().unwrap() + n as u32);
        for p in c - n..c {
            let b = step_layout.block_table(s)[p / 16];
            step_layout.slot_mapping.push(b * 16 + (p % 16) as u32);
        }
    }
    step_layout
}
