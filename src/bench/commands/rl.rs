//! `swerve-bench rl`: one RL iteration's time split and the in-memory weight handoff
//! ([`crate::bench::rl`]), with defaults sized for the backend in use.

use super::append_jsonl;
use crate::backend::{select, DeviceChoice, Selected};
use crate::bench::rl::{run, RlBenchOptions};
use anyhow::Result;
use std::path::PathBuf;

/// The command's options; `None` takes the backend's default (CPU / GPU).
pub struct RlOptions {
    /// Model shape with the Qwen2.5 vocabulary (tiny / qwen2.5-0.5b).
    pub preset: Option<String>,
    pub device: DeviceChoice,
    /// Handoffs timed (the median is reported).
    pub reps: usize,
    /// Tasks of the iteration (2 / 8).
    pub tasks: Option<usize>,
    /// Rollouts per task of the iteration (2 / 8).
    pub group: Option<usize>,
    pub max_turns: usize,
    /// Tokens per reply (16 / 256).
    pub max_turn_tokens: Option<usize>,
    pub max_context: usize,
    /// Also append the result as one JSON line to this file.
    pub jsonl: Option<PathBuf>,
}

pub fn rl(options: &RlOptions) -> Result<()> {
    let (backend, line) = select(options.device)?;
    println!("{line}");
    let gpu = matches!(backend, Selected::Cuda(_));
    let bench_options = RlBenchOptions {
        preset: options
            .preset
            .clone()
            .unwrap_or_else(|| if gpu { "qwen2.5-0.5b" } else { "tiny" }.into()),
        device: if gpu {
            DeviceChoice::Cuda
        } else {
            DeviceChoice::Cpu
        },
        reps: options.reps,
        tasks_per_iteration: options.tasks.unwrap_or(if gpu { 8 } else { 2 }),
        group: options.group.unwrap_or(if gpu { 8 } else { 2 }),
        max_turns: options.max_turns,
        max_turn_tokens: options
            .max_turn_tokens
            .unwrap_or(if gpu { 256 } else { 16 }),
        max_context: options.max_context,
    };
    let work = std::env::temp_dir().join(format!("swerve-bench-rl-{}", std::process::id()));
    let result = match backend {
        Selected::Cpu(b) => run(&b, &bench_options, &work),
        Selected::Cuda(b) => run(&*b, &bench_options, &work),
    };
    let _ = std::fs::remove_dir_all(&work);
    let row = result?;
    if let Some(path) = &options.jsonl {
        append_jsonl(path, &[row])?;
    }
    Ok(())
}
