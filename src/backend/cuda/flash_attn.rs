//! Launches of `kernels/flash_attn.cu`'s forward: causal GQA attention over packed
//! variable-length sequences, with the per-row logsumexp (`[T, heads]` f32) saved for the backward
//! pass. The backward's launches are in `attention_grad.rs`. The forward follows the canonical
//! reduction order of `kernels/attn_tile.cuh` with the engine's segment ([`SEGMENT_KEYS`]), so
//! the trainer's attention output of a row is the bits the engine computed for it.

use super::paged_attn::SEGMENT_KEYS;
use super::tensor::{CudaTensor, DeviceDType, DeviceUpload};
use super::tma;
use super::{as_i32, CudaDevice};
use anyhow::{bail, ensure, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Mirrors `FlashFwdConfig` in the kernel: (kernel, kBlockM, threads, shared-memory bytes): the
/// Q, K and V tiles and each thread's folded O (head_dim / 2 fp32).
fn forward_variant(head_dim: usize) -> Result<(&'static str, usize, u32, u32)> {
    const BLOCK_M: usize = 128;
    const BLOCK_N: usize = 64;
    const THREADS: u32 = 256;
    let smem = |d: usize| ((BLOCK_M + 2 * BLOCK_N) * (d + 8) * 2 + THREADS as usize * d * 2) as u32;
    Ok(match head_dim {
        128 => ("flash_attn_fwd_hd128", BLOCK_M, THREADS, smem(128)),
        64 => ("flash_attn_fwd_hd64", BLOCK_M, THREADS, smem(64)),
        32 => ("flash_attn_fwd_hd32", BLOCK_M, THREADS, smem(32)),
        16 => ("flash_attn_fwd_hd16", BLOCK_M, THREADS, smem(16)),
        other => bail!("flash attention: head_dim {other} has no kernel (16, 32, 64, 128)"),
    })
}

/// What the kernels need to know about a packed batch: `cu_seqlens` on the device, and the
/// longest sequence (the grid's first dimension) and the total, derived from the host copy when
/// the layout is made ([`VarlenLayout::upload`]): never taken from a caller, since a grid sized
/// for a shorter sequence would leave rows unwritten.
pub struct VarlenLayout {
    cu_seqlens: CudaTensor,
    num_seqs: usize,
    max_seqlen: usize,
    total_tokens: usize,
}

impl VarlenLayout {
    /// Checks host `cu_seqlens` ([`check_cu_seqlens`]) and copies it to the device (i32).
    pub fn upload(backend: &impl DeviceUpload, cu_seqlens: &[u32]) -> Result<Self> {
        let (max_seqlen, total_tokens) = check_cu_seqlens(cu_seqlens)?;
        as_i32("attention tokens", total_tokens)?;
        let offsets: Vec<i32> = cu_seqlens.iter().map(|&c| c as i32).collect();
        Ok(Self {
            cu_seqlens: backend.upload_pod(&offsets, &[offsets.len()], DeviceDType::I32)?,
            num_seqs: cu_seqlens.len() - 1,
            max_seqlen,
            total_tokens,
        })
    }
    /// i32 `[num_seqs + 1]` on the device.
    pub fn cu_seqlens(&self) -> &CudaTensor {
        &self.cu_seqlens
    }
    pub fn num_seqs(&self) -> usize {
        self.num_seqs
    }
    /// The longest sequence, from the host copy.
    pub fn max_seqlen(&self) -> usize {
        self.max_seqlen
    }
    pub fn total_tokens(&self) -> usize {
        self.total_tokens
    }
}

/// Checks that each named device address is a multiple of its alignment: the kernels move
/// 16-byte vectors (`cp.async`, `uint4` / `float4` loads and stores) and 8-byte vector
/// reductions, which fault or silently misbehave on a misaligned address. Pool and arena tensors
/// are 256-byte aligned; a view at an offset need not be.
pub fn check_alignment(op: &str, operands: &[(&str, u64, u64)]) -> Result<()> {
    for &(what, ptr, align) in operands {
        ensure!(
            ptr.is_multiple_of(align),
            "{op}: {what} at {ptr:#x} is not {align}-byte aligned (the kernel moves \
             {align}-byte vectors)"
        );
    }
    Ok(())
}

/// Checks that a kernel's dynamic shared memory fits what the device lets a block opt into.
pub fn check_shared_memory(device: &CudaDevice, kernel: &str, smem: u32) -> Result<()> {
    let limit = device.max_shared_memory_per_block_optin()?;
    ensure!(
        smem as usize <= limit,
        "{kernel} needs {smem} B of shared memory per block; this GPU allows {limit} B \
         (no variant of it for less shared memory yet)"
    );
    Ok(())
}

/// Checks host `cu_seqlens` (starts at 0, non-decreasing) and returns (max_seqlen, total).
pub fn check_cu_seqlens(cu_seqlens: &[u32]) -> Result<(usize, usize)> {
    ensure!(
        cu_seqlens.len() >= 2 && cu_seqlens[0] == 0,
        "cu_seqlens must start at 0 and describe at least one sequence: {:?}",
        &cu_seqlens[..cu_seqlens.len().min(4)]
    );
    let mut max_seqlen = 0;
    for (i, w) in cu_seqlens.windows(2).enumerate() {
        ensure!(
            w[1] >= w[0],
            "cu_seqlens decreases at sequence {i}: {} then {}",
            w[0],
            w[1]
        );
        max_seqlen = max_seqlen.max((w[1] - w[0]) as usize);
    }
    Ok((max_seqlen, *cu_seqlens.last().unwrap() as usize))
}

impl CudaDevice {
    /// `out = softmax(scale q k^T, causal) v` per sequence and head, `lse [T, heads]` fp32 (the
    /// layout of `BackendGrad::attention_with_lse`).
    /// `q, out [T, heads, hd]`, `k, v [T, kv_heads, hd]`, all bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_fwd(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        layout: &VarlenLayout,
        heads: usize,
        kv_heads: usize,
        softmax_scale: f32,
        out: &mut CudaTensor,
        lse: &mut CudaTensor,
    ) -> Result<()> {
        let head_dim = check_forward_operands(q, k, v, layout, heads, kv_heads, out, lse)?;
        if self.hopper_attention() {
            let operands = (q, k, v, out, lse);
            return self.flash_attn_fwd_sm90(
                operands,
                layout,
                heads,
                kv_heads,
                head_dim,
                softmax_scale,
            );
        }
        let (name, block_m, threads, smem) = forward_variant(head_dim)?;
        let f = self.function_with_smem("flash_attn", name, smem)?;
        as_i32("tokens", layout.total_tokens)?;
        let (heads_i, kv_i) = (as_i32("heads", heads)?, as_i32("kv_heads", kv_heads)?);
        let segment_keys = SEGMENT_KEYS as i32;
        let cfg = LaunchConfig {
            grid_dim: (
                // Derived from the host cu_seqlens when the layout was made.
                layout.max_seqlen.div_ceil(block_m).max(1) as u32,
                heads as u32,
                layout.num_seqs as u32,
            ),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        let (qp, kp, vp, op, lp, cp) = (
            q.ptr(),
            k.ptr(),
            v.ptr(),
            out.ptr(),
            lse.ptr(),
            layout.cu_seqlens.ptr(),
        );
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&qp)
            .arg(&kp)
            .arg(&vp)
            .arg(&op)
            .arg(&lp)
            .arg(&cp)
            .arg(&heads_i)
            .arg(&kv_i)
            .arg(&segment_keys)
            .arg(&softmax_scale);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}

/// Mirrors `FlashFwdSm90Config` in `kernels/flash_attn_sm90.cu`: (kernel, threads, shared-memory
/// bytes): Q (128 rows), 2 stages of K and V (64 rows each), 9 mbarriers, and 1024 bytes to align
/// the tiles to their swizzle atoms (the folded O lives in registers).
fn forward_variant_sm90(head_dim: usize) -> Result<(&'static str, u32, u32)> {
    let name = match head_dim {
        128 => "flash_attn_fwd_sm90_hd128",
        64 => "flash_attn_fwd_sm90_hd64",
        32 => "flash_attn_fwd_sm90_hd32",
        16 => "flash_attn_fwd_sm90_hd16",
        other => bail!("flash attention (sm_90): head_dim {other} has no kernel (16, 32, 64, 128)"),
    };
    let smem = 128 * head_dim * 2 + 4 * 64 * head_dim * 2 + 9 * 8 + 1024;
    Ok((name, 384, smem as u32))
}

impl CudaDevice {
    /// [`CudaDevice::flash_attn_fwd`] on the sm_90a kernel (operands checked by the caller):
    /// tensor maps of q, k and v for its TMA loads, the rest as the sm_80 kernel takes them.
    fn flash_attn_fwd_sm90(
        &self,
        (q, k, v, out, lse): (
            &CudaTensor,
            &CudaTensor,
            &CudaTensor,
            &mut CudaTensor,
            &mut CudaTensor,
        ),
        layout: &VarlenLayout,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        softmax_scale: f32,
    ) -> Result<()> {
        const BLOCK_M: usize = 128;
        let (name, threads, smem) = forward_variant_sm90(head_dim)?;
        let f = self.function_with_smem("flash_attn_sm90", name, smem)?;
        let t = layout.total_tokens;
        as_i32("tokens", t)?;
        let map_q = tma::bf16_rows_heads_dim("attention q", q.ptr(), t, heads, head_dim, BLOCK_M)?;
        let map_k = tma::bf16_rows_heads_dim("attention k", k.ptr(), t, kv_heads, head_dim, 64)?;
        let map_v = tma::bf16_rows_heads_dim("attention v", v.ptr(), t, kv_heads, head_dim, 64)?;
        let (heads_i, kv_i) = (as_i32("heads", heads)?, as_i32("kv_heads", kv_heads)?);
        let segment_keys = SEGMENT_KEYS as i32;
        let cfg = LaunchConfig {
            grid_dim: (
                layout.max_seqlen.div_ceil(BLOCK_M).max(1) as u32,
                heads as u32,
                layout.num_seqs as u32,
            ),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        let (op, lp, cp) = (out.ptr(), lse.ptr(), layout.cu_seqlens.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&map_q)
            .arg(&map_k)
            .arg(&map_v)
            .arg(&op)
            .arg(&lp)
            .arg(&cp)
            .arg(&heads_i)
            .arg(&kv_i)
            .arg(&segment_keys)
            .arg(&softmax_scale);
        // SAFETY: argument order and types match the kernel; the maps name q, k and v, which the
        // caller checked against the layout; sizes checked above.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}

/// Checks the forward's dtypes, shapes (against the layout's tokens and the GQA ratio), grid
/// limits and alignment; returns the head dim.
#[allow(clippy::too_many_arguments)]
fn check_forward_operands(
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    layout: &VarlenLayout,
    heads: usize,
    kv_heads: usize,
    out: &CudaTensor,
    lse: &CudaTensor,
) -> Result<usize> {
    for (what, t) in [("q", q), ("k", k), ("v", v), ("out", out)] {
        ensure!(
            t.dtype() == DeviceDType::Bf16,
            "attention: {what} is {:?}, expected bf16",
            t.dtype()
        );
    }
    ensure!(
        lse.dtype() == DeviceDType::F32,
        "attention: lse must be f32"
    );
    let t = layout.total_tokens;
    ensure!(
        heads > 0 && kv_heads > 0 && heads.is_multiple_of(kv_heads),
        "attention: {heads} heads over {kv_heads} kv heads"
    );
    ensure!(
        t > 0 && q.len().is_multiple_of(t * heads),
        "attention: q {:?} for {t} tokens x {heads} heads",
        q.shape()
    );
    let head_dim = q.len() / (t * heads);
    ensure!(
        k.len() == t * kv_heads * head_dim
            && v.len() == k.len()
            && out.len() == q.len()
            && lse.len() == heads * t,
        "attention: q {:?}, k {:?}, v {:?}, out {:?}, lse {:?} for {t} tokens, {heads}/{kv_heads} heads of {head_dim}",
        q.shape(),
        k.shape(),
        v.shape(),
        out.shape(),
        lse.shape()
    );
    ensure!(
        layout.num_seqs <= 65_535 && heads <= 65_535,
        "attention: {} sequences x {heads} heads exceed the grid",
        layout.num_seqs
    );
    check_alignment(
        "attention",
        &[
            ("q", q.ptr(), 16),
            ("k", k.ptr(), 16),
            ("v", v.ptr(), 16),
            ("out", out.ptr(), 16),
            ("lse", lse.ptr(), 4),
        ],
    )?;
    Ok(head_dim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misaligned_operands_are_named() {
        assert!(
            check_alignment("attention", &[("q", 0x1000, 16), ("dq_accum", 0x2008, 8)]).is_ok()
        );
        let err = check_alignment("attention", &[("q", 0x1000, 16), ("k", 0x1008, 16)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("k at 0x1008 is not 16-byte aligned"), "{err}");
        let err = check_alignment("attention backward", &[("dq_accum", 0x2004, 8)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("dq_accum at 0x2004 is not 8-byte aligned"),
            "{err}"
        );
    }

    #[test]
    fn cu_seqlens_are_validated() {
        assert_eq!(check_cu_seqlens(&[0, 3, 3, 10]).unwrap(), (7, 10));
        assert!(check_cu_seqlens(&[0]).is_err());
        assert!(check_cu_seqlens(&[1, 3]).is_err());
        assert!(check_cu_seqlens(&[0, 5, 4]).is_err());
    }

    #[test]
    fn every_qwen_head_dim_has_a_kernel() {
        for hd in [64, 128] {
            let (_, _, _, smem) = forward_variant(hd).unwrap();
            assert!(smem <= 227 * 1024, "hd {hd}: {smem} bytes of shared memory");
        }
        assert!(forward_variant(80).is_err());
    }
}
