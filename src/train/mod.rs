//! The training side: `score` (per-token logprobs of given token sequences, the trainer's
//! "recompute old logprobs" step) and `tokenize` (a data file as the trainer tokenizes it).

pub mod score;
pub mod tokenize;
