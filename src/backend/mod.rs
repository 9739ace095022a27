//! The narrow set of fused operations the model is written against (DESIGN.md decision 1).
//!
//! Model code calls only these; each backend implements them over its own tensor storage. The CPU
//! backend ([`cpu::CpuBackend`]) is the reference: plain f32 loops, obviously correct. The CUDA
//! backend ([`cuda`]) runs the same operations with the kernels in `kernels/`.
//!
//! Conventions: activations are row-major `[tokens, features]`; a sequence batch is packed
//! (tokens of all sequences back to back) and described by `cu_seqlens` (`[0, len0, len0+len1,
//! ...]`) and per-token `positions`; weights follow HF (`linear` computes `x W^T + b` with `W`
//! stored `[out_features, in_features]`).

pub mod cpu;
pub mod cuda;

pub use cuda::CudaBackend;

use crate::tensor::HostTensor;
use anyhow::{bail, Result};

/// Rotary embedding parameters shared by every layer: the inverse frequencies of the
/// `head_dim / 2` rotated pairs and YaRN's attention scaling (1 without YaRN).
#[derive(Clone, Debug)]
pub struct Rotary {
    pub inv_freq: Vec<f64>,
    pub attention_scaling: f64,
}

pub trait Backend {
    type Tensor;

    /// A short name for logs and tables: `cpu`, `cuda:0 (NVIDIA H100 ...)`.
    fn name(&self) -> String;

    /// Copies a host tensor (any float dtype) into this backend's storage.
    fn upload(&self, tensor: &HostTensor<'_>) -> Result<Self::Tensor>;
    /// Copies a model's parameters, in order. Backends that keep parameters in one arena
    /// (CUDA: a single allocation with aligned views) override this.
    fn upload_params(&self, tensors: &[&HostTensor<'_>]) -> Result<Vec<Self::Tensor>> {
        tensors.iter().map(|t| self.upload(t)).collect()
    }
    /// A zero-filled activation tensor (bf16 on CUDA, f32 on the CPU).
    fn zeros(&self, shape: &[usize]) -> Result<Self::Tensor>;
    /// A zero-filled tensor kept in f32 on every backend: logits, losses, statistics.
    fn zeros_f32(&self, shape: &[usize]) -> Result<Self::Tensor> {
        self.zeros(shape)
    }
    /// Every element as f32 on the host.
    fn to_host(&self, tensor: &Self::Tensor) -> Result<Vec<f32>>;
    fn shape<'t>(&self, tensor: &'t Self::Tensor) -> &'t [usize];
    /// A copy of rows `range` of a tensor (first dimension).
    fn slice_rows(
        &self,
        tensor: &Self::Tensor,
        range: std::ops::Range<usize>,
    ) -> Result<Self::Tensor>;

    /// `out[t] = table[ids[t]]`; `table: [vocab, d]`, `out: [T, d]`.
    fn embedding(&self, table: &Self::Tensor, ids: &[u32], out: &mut Self::Tensor) -> Result<()>;
    /// `out = x * rsqrt(mean(x^2) + eps) * weight`, row by row.
    fn rmsnorm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// `residual += delta; out = rmsnorm(residual) * weight`.
    fn add_rmsnorm(
        &self,
        residual: &mut Self::Tensor,
        delta: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// `out[T, n] = x[T, k] W[n, k]^T (+ bias[n])`; `out` may be an f32 tensor (logits).
    fn linear(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// Rotates `q: [T, heads, head_dim]` and `k: [T, kv_heads, head_dim]` in place (HF's
    /// rotate-half pairing `(i, i + head_dim/2)`), cos and sin multiplied by the attention scaling.
    fn rope(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        positions: &[u32],
        rotary: &Rotary,
    ) -> Result<()>;
    /// Causal GQA attention within each packed sequence. `q, out: [T, heads, head_dim]`,
    /// `k, v: [T, kv_heads, head_dim]`; query head `h` reads kv head `h / (heads / kv_heads)`.
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// `out = silu(gate) * up`, elementwise.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor, out: &mut Self::Tensor) -> Result<()>;
    /// `log_softmax(logits[t])[targets[t]]` for every row of `logits: [T, vocab]`.
    fn token_logprobs(&self, logits: &Self::Tensor, targets: &[u32]) -> Result<Vec<f32>>;
}

/// Where a command runs its model: `auto` (the GPU when there is one, else the CPU), `cpu`, or
/// `cuda` (an error without a usable GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Auto,
    Cpu,
    Cuda,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda),
            other => Err(format!(
                "unknown device {other:?}: expected auto, cpu or cuda"
            )),
        }
    }
}

/// The backend a command got, with the line it prints about it, e.g.
/// `backend: cpu (2 threads); CUDA: no CUDA driver (libcuda) on this machine`.
pub enum Selected {
    Cpu(cpu::CpuBackend),
    Cuda(Box<CudaBackend>),
}

pub fn select(choice: DeviceChoice) -> Result<(Selected, String)> {
    let cuda = match choice {
        DeviceChoice::Cpu => Err("not requested (--device cpu)".to_string()),
        DeviceChoice::Auto | DeviceChoice::Cuda => CudaBackend::open_default(),
    };
    match cuda {
        Ok(backend) => {
            let line = format!("backend: {} (CUDA kernels + cuBLASLt)", backend.name());
            Ok((Selected::Cuda(Box::new(backend)), line))
        }
        Err(reason) if choice == DeviceChoice::Cuda => bail!("--device cuda: {reason}"),
        Err(reason) => {
            let cpu = cpu::CpuBackend::new();
            let line = format!("backend: {}; CUDA: {reason}", cpu.name());
            Ok((Selected::Cpu(cpu), line))
        }
    }
}
