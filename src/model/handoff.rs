//! What a trainer hands an engine when its weights change in memory (the RL loop, DESIGN.md
//! decision 14): each tensor-parallel rank's own shard to the engine rank of the same index,
//! never the whole model.
//!
//! ```text
//!  same GPU:  trainer rank r ── RankSpans (device addresses) ──► engine rank r copies device to
//!             device, every rank at once
//!  host:      trainer rank r ── ShardTensor, one at a time ────► engine rank r overwrites it in
//!             (rank 0's tensors, then rank 1's, ...)             place; the channel is a
//!                                                                rendezvous, so at most the
//!                                                                tensor being written and the
//!                                                                next one exist at once
//! ```
//!
//! Trainer rank r and engine rank r hold the same part of every tensor: both load it from
//! `ModelConfig::shard(tp, r)` of the same config (Megatron's layout: q/k/v with their biases and
//! gate/up split by rows, o_proj/down by columns, the embedding and the LM head by vocabulary
//! rows, the norms whole), so a shard goes over as it is, with no conversion. The engine checks
//! that before it writes: a rank's [`LocalSizes`], and each streamed tensor's name and slice.

use crate::backend::DeviceSpan;
use crate::config::LocalSizes;
use crate::model::params::ParamShard;
use crate::tensor::HostTensor;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// One tensor-parallel rank's compute weights on its GPU: one span per parameter, in checkpoint
/// order, and the part of the model they are.
#[derive(Clone, Debug, PartialEq)]
pub struct RankSpans {
    pub local: LocalSizes,
    pub spans: Vec<DeviceSpan>,
}

/// One tensor of one rank's shard, handed over through host memory.
#[derive(Debug)]
pub struct ShardTensor {
    /// The tensor-parallel rank whose shard it belongs to.
    pub rank: usize,
    /// HF name.
    pub name: String,
    /// Where this rank's part sits in the whole tensor.
    pub shard: ParamShard,
    /// The part itself, in the trainer's compute precision (f32 on the CPU, where the compute
    /// weights are the masters; the engine then computes with exactly the trainer's weights).
    pub tensor: HostTensor<'static>,
}

/// Where a trainer writes its [`ShardTensor`]s: every rank's, in rank order, each in checkpoint
/// order.
pub type ShardSender = SyncSender<ShardTensor>;

/// A rendezvous channel for a streamed handoff: a send returns once the engine has taken the
/// tensor, so the host holds at most the tensor being written and the one being sent.
pub fn shard_channel() -> (ShardSender, Receiver<ShardTensor>) {
    sync_channel(0)
}
