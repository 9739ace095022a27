//! The training side. For now: `score`, the per-token logprobs of given token sequences (the
//! trainer's "recompute old logprobs" step).

pub mod score;
