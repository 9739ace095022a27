//! Training attention on CUDA: the forward that keeps the logsumexp, and the flash-attention
//! backward (`kernels/flash_attn.cu`, three launches) over packed variable-length causal GQA
//! sequences. The entry points of `BackendGrad::attention_with_lse` and
//! `BackendGrad::attention_backward` for [`CudaBackend`].
//!
//! ```text
//!  out, d_out, lse [T, heads] ──► preprocess ──► delta, lse·log2e [heads, T] f32; dq_accum = 0
//!  q, k, v, d_out, delta, lse ──► flash_attn_bwd_hd{D}: one block per (sequence, 128-key tile,
//!                                  kv head) ──► d_k, d_v += (in place, once per block)
//!                                               dq_accum += (fp32 atomics) [T, heads, D]
//!  dq_accum ──► dq_add ──► d_q += scale · dq_accum
//! ```
//!
//! Scratch (from the pool, returned when the call ends): `2 · T · heads` f32 statistics and the
//! `T · heads · head_dim` f32 dQ accumulator (0.23 GB at 16k tokens x 28 heads x 128).

use super::backend::CudaBackend;
use super::flash_attn::{check_alignment, check_cu_seqlens, VarlenLayout};
use super::tensor::{CudaTensor, DeviceDType};
use super::{as_i32, grid_stride_config};
use anyhow::{bail, ensure, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Keys per block of the backward (`FlashBwdConfig::kBlockN`).
pub const BWD_BLOCK_N: usize = 128;
/// Query rows per tile of the backward (`FlashBwdConfig::kBlockM`).
pub const BWD_BLOCK_M: usize = 64;
const BWD_THREADS: u32 = 256;

/// Mirrors `FlashBwdConfig` in the kernel: (kernel, shared-memory bytes).
pub fn backward_variant(head_dim: usize) -> Result<(&'static str, u32)> {
    let name = match head_dim {
        128 => "flash_attn_bwd_hd128",
        64 => "flash_attn_bwd_hd64",
        32 => "flash_attn_bwd_hd32",
        16 => "flash_attn_bwd_hd16",
        other => bail!("attention backward: head_dim {other} has no kernel (16, 32, 64, 128)"),
    };
    let row = head_dim + 8;
    let smem = 2 * BWD_BLOCK_N * row * 2 // K, V
        + 2 * 2 * BWD_BLOCK_M * row * 2 // Q, dO, two stages
        + BWD_BLOCK_N * (BWD_BLOCK_M + 8) * 2 // dS^T
        + 2 * 2 * BWD_BLOCK_M * 4; // lse, D, two stages
    Ok((name, smem as u32))
}

/// What the checks need of a tensor: its shape and dtype (host data, so they are testable
/// without a GPU).
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    pub shape: &'a [usize],
    pub dtype: DeviceDType,
}

impl<'a> From<&'a CudaTensor> for Operand<'a> {
    fn from(t: &'a CudaTensor) -> Self {
        Self {
            shape: t.shape(),
            dtype: t.dtype(),
        }
    }
}

impl Operand<'_> {
    fn expect(&self, what: &str, shape: &[usize], dtype: DeviceDType) -> Result<()> {
        ensure!(
            self.dtype == dtype,
            "attention: {what} is {:?}, expected {dtype:?}",
            self.dtype
        );
        ensure!(
            self.shape == shape,
            "attention: {what} has shape {:?}, expected {shape:?}",
            self.shape
        );
        Ok(())
    }
}

/// The checked geometry of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub tokens: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub max_seqlen: usize,
}

/// Checks q `[T, heads, hd]`, k and v `[T, kv_heads, hd]` (bf16) with `cu_seqlens` ending at
/// T > 0, the GQA ratio, a head dim with kernels, and `lse` `[T, heads]` f32.
pub fn check_forward(
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    lse: Operand<'_>,
    cu_seqlens: &[u32],
) -> Result<Geometry> {
    let (max_seqlen, total) = check_cu_seqlens(cu_seqlens)?;
    let [tokens, heads, head_dim] = *q.shape else {
        bail!(
            "attention: q has shape {:?}, expected [tokens, heads, head_dim]",
            q.shape
        )
    };
    let [_, kv_heads, _] = *k.shape else {
        bail!(
            "attention: k has shape {:?}, expected [tokens, kv_heads, head_dim]",
            k.shape
        )
    };
    ensure!(
        tokens == total && tokens > 0,
        "attention: q has {tokens} rows, cu_seqlens ends at {total} (at least one token needed)"
    );
    ensure!(
        kv_heads > 0 && heads % kv_heads == 0,
        "attention: {heads} query heads over {kv_heads} kv heads"
    );
    backward_variant(head_dim)?;
    q.expect("q", &[tokens, heads, head_dim], DeviceDType::Bf16)?;
    k.expect("k", &[tokens, kv_heads, head_dim], DeviceDType::Bf16)?;
    v.expect("v", &[tokens, kv_heads, head_dim], DeviceDType::Bf16)?;
    lse.expect("lse", &[tokens, heads], DeviceDType::F32)?;
    as_i32("tokens", tokens)?;
    ensure!(
        cu_seqlens.len() - 1 <= 65_535 && kv_heads <= 65_535 && heads <= 65_535,
        "attention: {} sequences x {heads} heads exceed the grid",
        cu_seqlens.len() - 1
    );
    Ok(Geometry {
        tokens,
        heads,
        kv_heads,
        head_dim,
        max_seqlen,
    })
}

/// [`check_forward`] plus out, d_out, d_q (shape of q), d_k, d_v (shape of k), all bf16.
#[allow(clippy::too_many_arguments)]
pub fn check_backward(
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    out: Operand<'_>,
    lse: Operand<'_>,
    d_out: Operand<'_>,
    cu_seqlens: &[u32],
    d_q: Operand<'_>,
    d_k: Operand<'_>,
    d_v: Operand<'_>,
) -> Result<Geometry> {
    let g = check_forward(q, k, v, lse, cu_seqlens)?;
    for (what, t, like) in [
        ("out", out, q),
        ("d_out", d_out, q),
        ("d_q", d_q, q),
        ("d_k", d_k, k),
        ("d_v", d_v, k),
    ] {
        t.expect(what, like.shape, DeviceDType::Bf16)?;
    }
    Ok(g)
}

impl CudaBackend {
    /// `cu_seqlens` on the device, as the kernels take it.
    fn varlen_layout(&self, cu_seqlens: &[u32], geometry: &Geometry) -> Result<VarlenLayout> {
        let layout = VarlenLayout::upload(self, cu_seqlens)?;
        ensure!(
            layout.max_seqlen() == geometry.max_seqlen && layout.total_tokens() == geometry.tokens,
            "attention: cu_seqlens changed between the checks and the upload"
        );
        Ok(layout)
    }

    /// Forward attention that also writes lse [T, heads] (f32).
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attention_with_lse(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        out: &mut CudaTensor,
        lse: &mut CudaTensor,
    ) -> anyhow::Result<()> {
        let g = check_forward(q.into(), k.into(), v.into(), (&*lse).into(), cu_seqlens)?;
        Operand::from(&*out).expect("out", q.shape(), DeviceDType::Bf16)?;
        let layout = self.varlen_layout(cu_seqlens, &g)?;
        self.device.flash_attn_fwd(
            q,
            k,
            v,
            &layout,
            g.heads,
            g.kv_heads,
            softmax_scale,
            out,
            lse,
        )
    }

    /// d_q, d_k, d_v (bf16, shapes of q, k, v) += the backward of causal packed GQA attention.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attention_backward(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        out: &CudaTensor,
        lse: &CudaTensor,
        d_out: &CudaTensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        d_q: &mut CudaTensor,
        d_k: &mut CudaTensor,
        d_v: &mut CudaTensor,
    ) -> anyhow::Result<()> {
        let g = check_backward(
            q.into(),
            k.into(),
            v.into(),
            out.into(),
            lse.into(),
            d_out.into(),
            cu_seqlens,
            (&*d_q).into(),
            (&*d_k).into(),
            (&*d_v).into(),
        )?;
        let layout = self.varlen_layout(cu_seqlens, &g)?;
        let sizes = BackwardSizes::new(&g)?;
        let scratch = BackwardScratch::alloc(self, &g)?;
        check_backward_alignment([q, k, v, out, d_out, d_q, d_k, d_v, lse], &scratch)?;
        let device = &self.device;
        let (name, smem) = backward_variant(g.head_dim)?; // a head dim check_backward accepted
        let f = device.function_with_smem("flash_attn", name, smem)?;

        // 1. delta = rowsum(d_out * out), lse * log2(e), dq_accum = 0.
        self.backward_preprocess(out, d_out, lse, &scratch, &sizes)?;

        // 2. dK, dV (+= in place) and the fp32 dQ accumulator: one block per (key tile, kv head,
        // sequence).
        let cfg = LaunchConfig {
            grid_dim: (
                layout.max_seqlen().div_ceil(BWD_BLOCK_N).max(1) as u32,
                g.kv_heads as u32,
                layout.num_seqs() as u32,
            ),
            block_dim: (BWD_THREADS, 1, 1),
            shared_mem_bytes: smem,
        };
        let (qp, kp, vp, dop, dkp, dvp, cp) = (
            q.ptr(),
            k.ptr(),
            v.ptr(),
            d_out.ptr(),
            d_k.ptr(),
            d_v.ptr(),
            layout.cu_seqlens().ptr(),
        );
        let (l2p, dp, qap) = (
            scratch.lse_log2.ptr(),
            scratch.delta.ptr(),
            scratch.dq_accum.ptr(),
        );
        let mut launch = device.stream.launch_builder(&f);
        launch
            .arg(&qp)
            .arg(&kp)
            .arg(&vp)
            .arg(&dop)
            .arg(&l2p)
            .arg(&dp)
            .arg(&qap)
            .arg(&dkp)
            .arg(&dvp)
            .arg(&cp)
            .arg(&sizes.tokens)
            .arg(&sizes.heads)
            .arg(&sizes.kv_heads)
            .arg(&softmax_scale);
        // SAFETY: as above; the grid covers every (sequence, key tile, kv head).
        unsafe { launch.launch(cfg) }?;

        // 3. d_q += scale * dq_accum.
        self.backward_dq_add(&scratch, d_q, &sizes, softmax_scale)?;
        // The scratch goes back to the pool here; the stream orders any reuse after the kernels.
        Ok(())
    }

    /// 1. delta = rowsum(d_out * out), lse * log2(e), dq_accum = 0.
    fn backward_preprocess(
        &self,
        out: &CudaTensor,
        d_out: &CudaTensor,
        lse: &CudaTensor,
        scratch: &BackwardScratch,
        sizes: &BackwardSizes,
    ) -> Result<()> {
        let device = &self.device;
        let f = device.function("flash_attn", "flash_attn_bwd_preprocess")?;
        let (op, dop, lp, l2p, dp, qap) = (
            out.ptr(),
            d_out.ptr(),
            lse.ptr(),
            scratch.lse_log2.ptr(),
            scratch.delta.ptr(),
            scratch.dq_accum.ptr(),
        );
        let mut launch = device.stream.launch_builder(&f);
        launch
            .arg(&op)
            .arg(&dop)
            .arg(&lp)
            .arg(&l2p)
            .arg(&dp)
            .arg(&qap)
            .arg(&sizes.tokens)
            .arg(&sizes.heads)
            .arg(&sizes.head_dim);
        // SAFETY: argument order and types match the kernel; every size was checked above.
        unsafe { launch.launch(grid_stride_config(device, sizes.chunks, 256)) }?;
        Ok(())
    }

    /// 3. d_q += scale * dq_accum.
    fn backward_dq_add(
        &self,
        scratch: &BackwardScratch,
        d_q: &mut CudaTensor,
        sizes: &BackwardSizes,
        softmax_scale: f32,
    ) -> Result<()> {
        let device = &self.device;
        let f = device.function("flash_attn", "flash_attn_bwd_dq_add")?;
        let (qap, dqp, n8) = (scratch.dq_accum.ptr(), d_q.ptr(), sizes.chunks as u64);
        let mut launch = device.stream.launch_builder(&f);
        launch.arg(&qap).arg(&dqp).arg(&n8).arg(&softmax_scale);
        // SAFETY: as above; dq_accum and d_q hold `8 * n8` elements each.
        unsafe { launch.launch(grid_stride_config(device, sizes.chunks, 256)) }?;
        Ok(())
    }
}

/// The backward's f32 scratch, from the pool for one call (fields in the reverse of their
/// allocation order: they return to the pool as locals would).
struct BackwardScratch {
    /// `[T, heads, hd]`: dQ before its scale.
    dq_accum: CudaTensor,
    /// `[heads, T]`: rowsum(d_out * out).
    delta: CudaTensor,
    /// `[heads, T]`: lse * log2(e).
    lse_log2: CudaTensor,
}

impl BackwardScratch {
    fn alloc(backend: &CudaBackend, g: &Geometry) -> Result<Self> {
        let (t, heads, hd) = (g.tokens, g.heads, g.head_dim);
        Ok(Self {
            lse_log2: backend.alloc(&[heads, t], DeviceDType::F32)?,
            delta: backend.alloc(&[heads, t], DeviceDType::F32)?,
            dq_accum: backend.alloc(&[t, heads, hd], DeviceDType::F32)?,
        })
    }
}

/// 16-byte vectors: cp.async of q, k, v, d_out tiles, bf16x8 loads of out, d_out, d_q, and
/// float4 of dq_accum (zeroed and read as float4; its reductions are 8-byte
/// red.global.add.v2.f32); d_k and d_v take bf16 pairs; lse, delta scalars.
fn check_backward_alignment(
    [q, k, v, out, d_out, d_q, d_k, d_v, lse]: [&CudaTensor; 9],
    scratch: &BackwardScratch,
) -> Result<()> {
    check_alignment(
        "attention backward",
        &[
            ("q", q.ptr(), 16),
            ("k", k.ptr(), 16),
            ("v", v.ptr(), 16),
            ("out", out.ptr(), 16),
            ("d_out", d_out.ptr(), 16),
            ("d_q", d_q.ptr(), 16),
            ("d_k", d_k.ptr(), 4),
            ("d_v", d_v.ptr(), 4),
            ("lse", lse.ptr(), 4),
            ("dq_accum", scratch.dq_accum.ptr(), 16),
            ("delta", scratch.delta.ptr(), 4),
            ("lse_log2", scratch.lse_log2.ptr(), 4),
        ],
    )
}

/// The sizes the backward's kernels take, checked to fit `int`.
struct BackwardSizes {
    tokens: i32,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    /// `T * heads * hd / 8`: 16-byte chunks of a `[T, heads, hd]` tensor.
    chunks: usize,
}

impl BackwardSizes {
    fn new(g: &Geometry) -> Result<Self> {
        let (t, heads, hd) = (g.tokens, g.heads, g.head_dim);
        Ok(Self {
            tokens: as_i32("tokens", t)?,
            heads: as_i32("heads", heads)?,
            kv_heads: as_i32("kv_heads", g.kv_heads)?,
            head_dim: as_i32("head_dim", hd)?,
            chunks: t * heads * hd / 8,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_head_dim_has_a_backward_kernel_that_fits_shared_memory() {
        // The kernel's own figures (FlashBwdConfig::kSmemBytes).
        for (hd, bytes) in [(128, 158_720), (64, 93_184), (32, 60_416), (16, 44_032)] {
            let (name, smem) = backward_variant(hd).unwrap();
            assert_eq!(smem, bytes, "{name}");
            assert!(smem <= 227 * 1024, "{name}: {smem} bytes");
        }
        let err = backward_variant(80).unwrap_err().to_string();
        assert!(err.contains("head_dim 80"), "{err}");
    }

    fn op(shape: &[usize], dtype: DeviceDType) -> Operand<'_> {
        Operand { shape, dtype }
    }

    /// `check_backward` on q `[10, 4, 64]`, k/v `[10, 2, 64]`, `cu_seqlens` [0, 3, 10], with the
    /// operand named `replace` given `shape` and `dtype` instead.
    fn check_with(replace: &str, shape: &[usize], dtype: DeviceDType) -> Result<Geometry> {
        let (qs, ks, ls): (&[usize], &[usize], &[usize]) = (&[10, 4, 64], &[10, 2, 64], &[10, 4]);
        let bf = DeviceDType::Bf16;
        let pick = |name: &str, default: Operand<'static>| match name == replace {
            true => op(shape, dtype),
            false => default,
        };
        check_backward(
            pick("q", op(qs, bf)),
            pick("k", op(ks, bf)),
            pick("v", op(ks, bf)),
            pick("out", op(qs, bf)),
            pick("lse", op(ls, DeviceDType::F32)),
            pick("d_out", op(qs, bf)),
            &[0, 3, 10],
            pick("d_q", op(qs, bf)),
            pick("d_k", op(ks, bf)),
            pick("d_v", op(ks, bf)),
        )
    }

    #[test]
    fn backward_checks_name_the_operand_at_fault() {
        let g = check_with("none", &[], DeviceDType::Bf16).unwrap();
        assert_eq!(
            g,
            Geometry {
                tokens: 10,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                max_seqlen: 7
            }
        );
        let bf = DeviceDType::Bf16;
        for (what, shape, dtype, message) in [
            (
                "lse",
                &[4, 10][..],
                DeviceDType::F32,
                "lse has shape [4, 10], expected [10, 4]",
            ),
            ("lse", &[10, 4][..], bf, "lse is Bf16, expected F32"),
            (
                "d_k",
                &[10, 4, 64][..],
                bf,
                "d_k has shape [10, 4, 64], expected [10, 2, 64]",
            ),
            (
                "d_v",
                &[10, 2, 64][..],
                DeviceDType::F32,
                "d_v is F32, expected Bf16",
            ),
            ("out", &[10, 4, 32][..], bf, "out has shape [10, 4, 32]"),
            ("d_out", &[10, 4, 64][..], DeviceDType::F32, "d_out is F32"),
            ("d_q", &[9, 4, 64][..], bf, "d_q has shape [9, 4, 64]"),
            (
                "v",
                &[10, 1, 64][..],
                bf,
                "v has shape [10, 1, 64], expected [10, 2, 64]",
            ),
            ("k", &[10, 3, 64][..], bf, "4 query heads over 3 kv heads"),
            (
                "k",
                &[10, 2, 32][..],
                bf,
                "k has shape [10, 2, 32], expected [10, 2, 64]",
            ),
            (
                "q",
                &[9, 4, 64][..],
                bf,
                "q has 9 rows, cu_seqlens ends at 10",
            ),
            (
                "q",
                &[10, 256][..],
                bf,
                "expected [tokens, heads, head_dim]",
            ),
            ("q", &[10, 4, 80][..], bf, "head_dim 80 has no kernel"),
        ] {
            let err = format!("{:#}", check_with(what, shape, dtype).unwrap_err());
            assert!(err.contains(message), "{what} {shape:?}: {err}");
        }
    }

    #[test]
    fn forward_checks_cu_seqlens_and_empty_batches() {
        let bf = DeviceDType::Bf16;
        let (q, k, lse) = ([0, 2, 16], [0, 1, 16], [0, 2]);
        let err = check_forward(
            op(&q, bf),
            op(&k, bf),
            op(&k, bf),
            op(&lse, DeviceDType::F32),
            &[0, 0],
        )
        .unwrap_err();
        assert!(err.to_string().contains("at least one token"), "{err}");
        let (q, k, lse) = ([5, 2, 16], [5, 1, 16], [5, 2]);
        for bad in [&[0u32, 3, 2, 5][..], &[1, 5], &[0]] {
            assert!(check_forward(
                op(&q, bf),
                op(&k, bf),
                op(&k, bf),
                op(&lse, DeviceDType::F32),
                bad
            )
            .is_err());
        }
        let g = check_forward(
            op(&q, bf),
            op(&k, bf),
            op(&k, bf),
            op(&lse, DeviceDType::F32),
            &[0, 0, 5, 5],
        )
        .unwrap();
        assert_eq!((g.max_seqlen, g.heads, g.kv_heads), (5, 2, 1));
    }

    /// The kernel's iteration space, written out: key tile `n_block` (the block returns if it
    /// starts past the sequence) visits query tiles `n0 / BM ..= (seqlen - 1) / BM`. Every causal
    /// pair (key <= query < seqlen) must be visited exactly once.
    #[test]
    fn the_backward_tiles_cover_each_causal_pair_once() {
        for seqlen in [
            1usize, 2, 63, 64, 65, 127, 128, 129, 191, 255, 256, 257, 300, 700,
        ] {
            let mut seen = vec![0u8; seqlen * seqlen];
            for n_block in 0..seqlen.div_ceil(BWD_BLOCK_N) {
                let n0 = n_block * BWD_BLOCK_N;
                assert!(n0 < seqlen);
                let m_first = n0 / BWD_BLOCK_M;
                let m_count = seqlen.div_ceil(BWD_BLOCK_M) - m_first;
                assert!(
                    m_count >= 1,
                    "seqlen {seqlen}: key tile {n_block} sees no query tile"
                );
                for m in m_first..m_first + m_count {
                    for key in n0..(n0 + BWD_BLOCK_N).min(seqlen) {
                        for query in m * BWD_BLOCK_M..((m + 1) * BWD_BLOCK_M).min(seqlen) {
                            if key <= query {
                                seen[key * seqlen + query] += 1;
                            }
                        }
                    }
                }
            }
            for key in 0..seqlen {
                for query in key..seqlen {
                    assert_eq!(
                        seen[key * seqlen + query],
                        1,
                        "seqlen {seqlen}: ({key}, {query})"
                    );
                }
            }
        }
    }

    #[test]
    fn a_key_tile_starts_on_a_query_tile_boundary() {
        assert_eq!(BWD_BLOCK_N % BWD_BLOCK_M, 0);
        assert_eq!(BWD_THREADS as usize, 2 * BWD_BLOCK_N);
    }
}
