//! Tensor maps for Hopper's TMA loads (`kernels/hopper.cuh`'s `tma_load_3d`): the 128-byte
//! `CUtensorMap` the driver encodes (`cuTensorMapEncodeTiled`) and a kernel takes as a
//! `__grid_constant__` parameter. A map names a global tensor's address, sizes and strides, the
//! box one copy moves and the shared-memory swizzle it lands in; it is encoded per launch (a few
//! microseconds on the host), since it holds the tensor's address.

use anyhow::{ensure, Result};
use cudarc::driver::sys::{
    self, CUresult, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill,
    CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::DeviceRepr;

/// An encoded tensor map, passed by value to a kernel.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct TmaMap(CUtensorMap);

// SAFETY: a plain 128-byte value the kernel receives by copy (its `TmaMap` parameter).
unsafe impl DeviceRepr for TmaMap {}

/// The shared-memory swizzle of a box whose rows are `row_bytes` long: the widest span (128, 64
/// or 32 bytes) the row fills, as the kernels lay their tiles out (`kSwizzleBytes`).
pub fn swizzle_for_row(row_bytes: usize) -> Result<(CUtensorMapSwizzle, usize)> {
    Ok(match row_bytes {
        b if b >= 128 => (CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B, 128),
        64 => (CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B, 64),
        32 => (CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B, 32),
        other => anyhow::bail!("no TMA swizzle for {other}-byte rows (32, 64, or 128 and more)"),
    })
}

/// A bf16 tensor `[rows, heads, head_dim]` (row-major, contiguous) as a 3-D map with the box
/// (`span / 2` columns, 1 head, `box_rows` rows), swizzled by `span` bytes: one column block of a
/// tile the kernel addresses by (column, head, row). Rows past the tensor's end read as zeros.
pub fn bf16_rows_heads_dim(
    what: &str,
    ptr: u64,
    rows: usize,
    heads: usize,
    head_dim: usize,
    box_rows: usize,
) -> Result<TmaMap> {
    let (swizzle, span) = swizzle_for_row(head_dim * 2)?;
    let box_cols = span / 2;
    ensure!(
        head_dim.is_multiple_of(box_cols) && (1..=256).contains(&box_rows),
        "{what}: a tensor map box of {box_cols} columns x {box_rows} rows does not tile head_dim {head_dim}"
    );
    ensure!(
        ptr.is_multiple_of(16),
        "{what}: a tensor map needs a 16-byte aligned address, got {ptr:#x}"
    );
    let dims: [u64; 3] = [head_dim as u64, heads as u64, rows as u64];
    // Strides of dimensions 1 and 2 in bytes (dimension 0 is contiguous).
    let strides: [u64; 2] = [(head_dim * 2) as u64, (heads * head_dim * 2) as u64];
    let boxes: [u32; 3] = [box_cols as u32, 1, box_rows as u32];
    let element_strides: [u32; 3] = [1, 1, 1];
    let mut map = std::mem::MaybeUninit::<CUtensorMap>::zeroed();
    // SAFETY: every pointer names a live array of the rank the call is given; the driver writes
    // the 128-byte map and reads nothing else.
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            3,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    ensure!(
        status == CUresult::CUDA_SUCCESS,
        "{what}: cuTensorMapEncodeTiled refused the map ({status:?}) of [{rows}, {heads}, {head_dim}] \
         bf16 at {ptr:#x}, box [{box_rows}, 1, {box_cols}], {span}-byte swizzle"
    );
    // SAFETY: written by the successful call above.
    Ok(TmaMap(unsafe { map.assume_init() }))
}
