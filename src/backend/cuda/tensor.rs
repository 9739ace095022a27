//! Device tensors and where their memory comes from (DESIGN.md decision 6).
//!
//! ```text
//!  parameters ──► one Arena (a single allocation, 256-byte aligned views, freed with the model)
//!  activations ─► BufferPool: size classes of cached allocations; a dropped tensor's buffer goes
//!                 back to its class and the next request of that class reuses it, so a forward
//!                 pass after the first makes no cudaMalloc at all
//! ```
//!
//! A [`CudaTensor`] is a shape, a dtype and a raw device pointer, plus the ownership that keeps
//! the pointer valid (an `Arc` of the arena, or a pooled buffer returned on drop). Everything runs
//! on the device's one stream, so buffers need no cross-stream events (the context's event
//! tracking is off; see `CudaDevice::open`).

use anyhow::{ensure, Context, Result};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Element types on the device: bf16 weights and activations, fp32 logits and statistics, fp64
/// rotary frequencies, 32-bit ids and offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceDType {
    Bf16,
    F32,
    F64,
    /// Token ids and positions.
    U32,
    /// Offsets such as `cu_seqlens`.
    I32,
}

impl DeviceDType {
    pub fn size(self) -> usize {
        match self {
            DeviceDType::Bf16 => 2,
            DeviceDType::F32 | DeviceDType::U32 | DeviceDType::I32 => 4,
            DeviceDType::F64 => 8,
        }
    }
}

/// Alignment of every tensor's first byte: enough for 16-byte vector loads and cp.async, and
/// what cuBLASLt prefers.
pub const TENSOR_ALIGN: usize = 256;

pub struct CudaTensor {
    shape: Vec<usize>,
    dtype: DeviceDType,
    ptr: CUdeviceptr,
    _storage: Storage,
}

enum Storage {
    Pooled(#[allow(dead_code)] PooledBuffer),
    Arena(#[allow(dead_code)] Arc<CudaSlice<u8>>),
}

impl CudaTensor {
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn dtype(&self) -> DeviceDType {
        self.dtype
    }
    /// Elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn num_bytes(&self) -> usize {
        self.len() * self.dtype.size()
    }
    /// The device address of element 0.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    /// Length of the last dimension.
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }
    pub fn rows(&self) -> usize {
        self.len() / self.cols().max(1)
    }
    /// A second handle to the same memory, for tensors carved from an [`Arena`] (which stays
    /// alive while any handle does); `None` for pooled tensors, which have one owner.
    pub fn share(&self) -> Option<CudaTensor> {
        match &self._storage {
            Storage::Arena(slice) => Some(CudaTensor {
                shape: self.shape.clone(),
                dtype: self.dtype,
                ptr: self.ptr,
                _storage: Storage::Arena(slice.clone()),
            }),
            Storage::Pooled(_) => None,
        }
    }

    /// A handle to the arena memory starting at this tensor, under another shape and dtype;
    /// `None` for pooled tensors.
    ///
    /// # Safety
    /// The new extent must lie inside the arena this tensor was carved from.
    pub unsafe fn share_as(&self, shape: &[usize], dtype: DeviceDType) -> Option<CudaTensor> {
        let mut t = self.share()?;
        t.shape = shape.to_vec();
        t.dtype = dtype;
        Some(t)
    }

    /// The same memory under another shape with as many elements.
    pub fn reshape(&mut self, shape: &[usize]) -> Result<()> {
        ensure!(
            shape.iter().product::<usize>() == self.len(),
            "cannot view {:?} as {shape:?}",
            self.shape
        );
        self.shape = shape.to_vec();
        Ok(())
    }
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaTensor({:?}, {:?}, {:#x})",
            self.shape, self.dtype, self.ptr
        )
    }
}

/// Counters of the caching allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// cudaMalloc calls made so far.
    pub device_allocations: u64,
    /// Requests served from the cache.
    pub reuses: u64,
    /// Bytes held by live tensors.
    pub bytes_in_use: usize,
    /// Bytes cached for reuse.
    pub bytes_cached: usize,
}

/// A caching allocator for activations: freed buffers are kept by size class and handed out
/// again; only a miss reaches the driver. When the driver is out of memory the cache is released
/// and the allocation retried once.
#[derive(Clone)]
pub struct BufferPool {
    stream: Arc<CudaStream>,
    state: Arc<Mutex<PoolState>>,
    /// Whether an out-of-memory miss may return the cache to the driver (not for a pool whose
    /// buffers captured CUDA graphs keep using: [`BufferPool::for_graphs`]).
    release_on_oom: bool,
}

#[derive(Default)]
struct PoolState {
    free: BTreeMap<usize, Vec<CudaSlice<u8>>>,
    stats: PoolStats,
}

struct PooledBuffer {
    slice: Option<CudaSlice<u8>>,
    class: usize,
    state: Arc<Mutex<PoolState>>,
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let (Some(slice), Ok(mut state)) = (self.slice.take(), self.state.lock()) {
            state.stats.bytes_in_use -= self.class;
            state.stats.bytes_cached += self.class;
            state.free.entry(self.class).or_default().push(slice);
        }
    }
}

/// The size class of a request: multiples of 512 bytes up to 1 MiB, of 2 MiB above.
fn size_class(bytes: usize) -> usize {
    const SMALL: usize = 512;
    const LARGE: usize = 2 << 20;
    let bytes = bytes.max(1);
    if bytes <= 1 << 20 {
        bytes.div_ceil(SMALL) * SMALL
    } else {
        bytes.div_ceil(LARGE) * LARGE
    }
}

fn device_ptr_of(slice: &CudaSlice<u8>, stream: &CudaStream) -> CUdeviceptr {
    let (ptr, _sync) = slice.device_ptr(stream);
    ptr
}

impl BufferPool {
    pub fn new(stream: Arc<CudaStream>) -> Self {
        Self {
            stream,
            state: Arc::default(),
            release_on_oom: true,
        }
    }

    /// A pool whose cached buffers are never returned to the driver, even when it runs out of
    /// memory: captured CUDA graphs bake them in (`cuda/graphs.rs`) and replay into them later.
    pub fn for_graphs(stream: Arc<CudaStream>) -> Self {
        Self {
            release_on_oom: false,
            ..Self::new(stream)
        }
    }

    pub fn stats(&self) -> PoolStats {
        self.state.lock().map(|s| s.stats).unwrap_or_default()
    }

    /// Returns every cached buffer to the driver.
    pub fn release_cached(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.free.clear();
            state.stats.bytes_cached = 0;
        }
    }

    /// An uninitialised tensor; callers overwrite every element before reading any.
    pub fn alloc(&self, shape: &[usize], dtype: DeviceDType) -> Result<CudaTensor> {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        let class = size_class(bytes);
        let reused = {
            let mut state = self.state.lock().expect("buffer pool lock poisoned");
            let slice = state.free.get_mut(&class).and_then(Vec::pop);
            if slice.is_some() {
                state.stats.reuses += 1;
                state.stats.bytes_cached -= class;
                state.stats.bytes_in_use += class;
            }
            slice
        };
        let slice = match reused {
            Some(slice) => slice,
            None => {
                let slice = self.device_alloc(class)?;
                let mut state = self.state.lock().expect("buffer pool lock poisoned");
                state.stats.device_allocations += 1;
                state.stats.bytes_in_use += class;
                slice
            }
        };
        let ptr = device_ptr_of(&slice, &self.stream);
        Ok(CudaTensor {
            shape: shape.to_vec(),
            dtype,
            ptr,
            _storage: Storage::Pooled(PooledBuffer {
                slice: Some(slice),
                class,
                state: self.state.clone(),
            }),
        })
    }

    fn device_alloc(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        // SAFETY: the memory is uninitialised; every kernel writing a fresh tensor covers it.
        match unsafe { self.stream.alloc::<u8>(bytes) } {
            Ok(slice) => Ok(slice),
            Err(e) if !self.release_on_oom => Err(e).with_context(|| {
                format!(
                    "out of GPU memory allocating {:.1} MiB for a CUDA graph",
                    bytes as f64 / (1 << 20) as f64
                )
            }),
            Err(_) => {
                self.release_cached();
                self.stream.synchronize()?;
                unsafe { self.stream.alloc::<u8>(bytes) }.with_context(|| {
                    format!(
                        "out of GPU memory allocating {:.1} MiB ({:.1} MiB held by live tensors)",
                        bytes as f64 / (1 << 20) as f64,
                        self.stats().bytes_in_use as f64 / (1 << 20) as f64
                    )
                })
            }
        }
    }
}

/// Host-to-device copies as the backend makes them (into its active pool, refused inside a graph
/// capture): what the device forms of attention layouts and graph inputs are built with, so
/// their files need not know [`super::CudaBackend`], which implements it.
pub trait DeviceUpload {
    /// The stream every allocation and copy is ordered on.
    fn stream(&self) -> &Arc<CudaStream>;
    /// Copies host bytes into `tensor` (sizes must match).
    fn write_bytes(&self, tensor: &mut CudaTensor, bytes: &[u8]) -> Result<()>;
    /// A pooled tensor holding `values`.
    fn upload_pod<T: bytemuck::Pod>(
        &self,
        values: &[T],
        shape: &[usize],
        dtype: DeviceDType,
    ) -> Result<CudaTensor>;
}

/// One allocation holding many tensors (the model's parameters): sized up front, carved into
/// 256-byte aligned views, freed when the last view is dropped.
pub struct Arena {
    slice: Arc<CudaSlice<u8>>,
    base: CUdeviceptr,
    used: usize,
}

impl Arena {
    /// Bytes an arena needs for tensors of these byte sizes.
    pub fn bytes_for(sizes: impl IntoIterator<Item = usize>) -> usize {
        sizes
            .into_iter()
            .map(|b| b.div_ceil(TENSOR_ALIGN) * TENSOR_ALIGN)
            .sum()
    }

    pub fn new(stream: &Arc<CudaStream>, bytes: usize) -> Result<Self> {
        // SAFETY: uninitialised; every view is written by its upload before use.
        let slice = unsafe { stream.alloc::<u8>(bytes.max(1)) }.with_context(|| {
            format!(
                "out of GPU memory allocating the {:.1} MiB parameter arena",
                bytes as f64 / (1 << 20) as f64
            )
        })?;
        let base = device_ptr_of(&slice, stream);
        Ok(Self {
            slice: Arc::new(slice),
            base,
            used: 0,
        })
    }

    /// The next view of `shape`; errors when the arena is exhausted.
    pub fn take(&mut self, shape: &[usize], dtype: DeviceDType) -> Result<CudaTensor> {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        let padded = bytes.div_ceil(TENSOR_ALIGN) * TENSOR_ALIGN;
        ensure!(
            self.used + padded <= self.slice.len(),
            "parameter arena of {} bytes exhausted at a tensor {shape:?}",
            self.slice.len()
        );
        let ptr = self.base + self.used as u64;
        self.used += padded;
        Ok(CudaTensor {
            shape: shape.to_vec(),
            dtype,
            ptr,
            _storage: Storage::Arena(self.slice.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_and_never_shrink() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(512), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), 2 << 20);
        assert_eq!(size_class(5 << 20), 6 << 20);
        for bytes in [3usize, 4097, 999_999, 12_345_678] {
            assert!(size_class(bytes) >= bytes);
        }
    }

    #[test]
    fn arena_sizes_are_aligned_sums() {
        assert_eq!(Arena::bytes_for([1, 256, 257]), 256 + 256 + 512);
    }
}
