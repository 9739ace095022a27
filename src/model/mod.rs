//! The Qwen2 model: parameter layout, checkpoint loading, the forward pass, synthetic models.

pub mod backward;
mod decode_step;
pub mod handoff;
pub mod layer;
pub mod model_arg;
pub mod parallel;
pub mod params;
pub mod qwen2;
pub mod synthetic;
pub mod toy;
pub mod weights;

pub use params::{LayerParams, Qwen2Params};
pub use qwen2::{PackedBatch, PagedKv, Qwen2Model};
