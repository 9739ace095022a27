//! Element types and host-side tensors.
//!
//! A [`HostTensor`] is shape + dtype + bytes on the host: a checkpoint tensor borrowed from a
//! memory map, or an owned buffer built in memory. Backends turn them into their own storage
//! (`Backend::upload`): f32 `Vec`s on the CPU, bf16 device buffers on CUDA.

use anyhow::{bail, Result};
use half::{bf16, f16};
use std::borrow::Cow;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    BF16,
    F16,
    F32,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::F32 => "F32",
        }
    }
}

/// Shape, element type and little-endian bytes of one tensor held on the host.
#[derive(Clone, Debug)]
pub struct HostTensor<'a> {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Cow<'a, [u8]>,
}

impl<'a> HostTensor<'a> {
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> HostTensor<'static> {
        HostTensor {
            dtype: DType::F32,
            shape,
            bytes: Cow::Owned(bytemuck::cast_slice(values).to_vec()),
        }
    }

    pub fn from_bf16(shape: Vec<usize>, values: &[bf16]) -> HostTensor<'static> {
        HostTensor {
            dtype: DType::BF16,
            shape,
            bytes: Cow::Owned(bytemuck::cast_slice(values).to_vec()),
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Checks that the byte length matches shape and dtype.
    pub fn check(&self) -> Result<()> {
        let want = self.numel() * self.dtype.size_bytes();
        if self.bytes.len() != want {
            bail!(
                "{} tensor of shape {:?} needs {want} bytes, has {}",
                self.dtype.name(),
                self.shape,
                self.bytes.len()
            );
        }
        Ok(())
    }

    /// The part with indices `range` along dimension `dim` (a tensor-parallel rank's slice). Rows
    /// (`dim` 0) stay borrowed; any other dimension is copied out.
    pub fn slice(self, dim: usize, range: std::ops::Range<usize>) -> Result<HostTensor<'a>> {
        let Some(&extent) = self.shape.get(dim) else {
            bail!(
                "slice along dimension {dim} of a tensor of shape {:?}",
                self.shape
            );
        };
        if range.start > range.end || range.end > extent {
            bail!(
                "slice {range:?} along dimension {dim} of a tensor of shape {:?}",
                self.shape
            );
        }
        let elem = self.dtype.size_bytes();
        // Bytes of one index along `dim` (everything after it), and runs of it before.
        let inner: usize = self.shape[dim + 1..].iter().product::<usize>() * elem;
        let outer: usize = self.shape[..dim].iter().product();
        let mut shape = self.shape.clone();
        shape[dim] = range.len();
        let bytes = if outer == 1 {
            match self.bytes {
                Cow::Borrowed(b) => Cow::Borrowed(&b[range.start * inner..range.end * inner]),
                Cow::Owned(b) => Cow::Owned(b[range.start * inner..range.end * inner].to_vec()),
            }
        } else {
            let mut out = Vec::with_capacity(outer * range.len() * inner);
            for o in 0..outer {
                let base = o * extent * inner;
                out.extend_from_slice(
                    &self.bytes[base + range.start * inner..base + range.end * inner],
                );
            }
            Cow::Owned(out)
        };
        Ok(HostTensor {
            dtype: self.dtype,
            shape,
            bytes,
        })
    }

    /// Every element widened to f32 (exact for all three dtypes).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.bytes.len() / self.dtype.size_bytes()];
        self.write_f32(&mut out);
        out
    }

    /// Every element widened to f32 into `out`, in place (as many as both hold).
    pub fn write_f32(&self, out: &mut [f32]) {
        let b = &self.bytes;
        match self.dtype {
            DType::F32 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            DType::BF16 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                }
            }
            DType::F16 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                }
            }
        }
    }

    /// Every element rounded to bf16 (round to nearest even).
    pub fn to_bf16_vec(&self) -> Vec<bf16> {
        match self.dtype {
            DType::BF16 => self
                .bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            _ => self.to_f32_vec().into_iter().map(bf16::from_f32).collect(),
        }
    }
}
