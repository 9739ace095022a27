//! swerve-bench: throughput. With no arguments: prefill tokens/s of the embedded default model
//! (built in memory, no download) on the backend in use, as a table. Parses arguments and runs
//! the commands of [`swerve::bench::commands`].

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};
use std::path::PathBuf;
use swerve::backend::DeviceChoice;
use swerve::bench::commands;

#[derive(Parser)]
#[command(
    name = "swerve-bench",
    version,
    about = "swerve's throughput benchmarks"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no subcommand: `prefill` with these options.
    #[command(flatten)]
    prefill: PrefillArgs,
    /// GEMMs pinned per shape class for every batch size (exact rollout logprobs, the training
    /// commands' default); `false`: cuBLASLt's per-shape choice (`swerve-serve`'s default).
    #[arg(long, global = true, default_value_t = true, action = clap::ArgAction::Set)]
    exact_logprobs: bool,
    /// With exact logprobs, the tiles of the forward GEMMs: `per-m` (cuBLASLt's no-split-K
    /// choice for each row count, probed to keep each class's bits) or `class` (one algorithm per
    /// class for every row count, the earlier exact GEMMs): the same bits, for comparing speed.
    #[arg(long, global = true, default_value = "per-m", value_parser = ["per-m", "class"])]
    exact_gemm_tiles: String,
}

#[derive(Subcommand)]
enum Command {
    /// Prefill tokens/s and model TFLOP/s of one sequence at each length (the default command).
    Prefill(PrefillArgs),
    /// An agent-shaped rollout workload through the engine: G rollouts per task, multi-turn,
    /// growing contexts; tokens/s, prefix-cache hit rate, step time and host overhead.
    Agent(AgentArgs),
    /// Decode steps over the paged KV cache at several batch sizes (tokens/s, share of the
    /// bandwidth roofline on a GPU), and paged decode attention alone at long contexts.
    Decode(DecodeArgs),
    /// One training step (forward, fused loss, backward, AdamW) on packed tokens: tokens/s,
    /// model TFLOP/s, MFU against the measured GEMM rate and device memory on a GPU. Not the
    /// -tpN presets: --tensor-parallel N runs the learner's sequence-parallel step on N ranks.
    Train(TrainArgs),
    /// One RL iteration's time split (rollout, environment, grading, training, handoff) on a
    /// preset model, and the in-memory weight handoff against the size of the weights (GB/s).
    Rl(RlArgs),
    /// The memory of one GPU, part by part, for training and rollouts of a model on N GPUs of a
    /// given size (no GPU needed): whether it fits, and the context parallelism it would need.
    Plan(PlanArgs),
    /// Each CUDA kernel against the CPU reference and the card's measured ceilings (needs a GPU);
    /// with --static, no GPU: each kernel's registers, spills and shared memory from the build's
    /// ptxas report, and the decode configurations' blocks per SM and bytes in flight on H100/H200.
    Kernels {
        /// The static report instead of the measurements (no GPU needed).
        #[arg(long = "static")]
        static_report: bool,
        #[command(flatten)]
        jsonl: JsonlArg,
    },
    /// The Qwen2.5 forward GEMMs at each row count: the pinned algorithm, cuBLASLt's own choice
    /// and every no-split-K algorithm it offers, each checked bit for bit against the pinned
    /// rows and timed against the copy bandwidth (needs a GPU).
    Gemm(GemmArgs),
}

#[derive(clap::Args)]
struct GemmArgs {
    /// Presets whose forward GEMM shapes are measured (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b,qwen2.5-32b,qwen2.5-72b"
    )]
    presets: Vec<String>,
    /// Tensor-parallel sizes (one rank's shapes each; comma-separated).
    #[arg(long = "tp", value_delimiter = ',', default_value = "1,2,4,8")]
    tensor_parallel: Vec<usize>,
    /// Row counts M (tokens); the largest gives the reference rows.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,3,4,8,13,16,17,32,33,64,100,128,256,512,1024,4096"
    )]
    rows: Vec<usize>,
    /// Algorithms asked of the heuristic per workspace setting.
    #[arg(long, default_value_t = 8)]
    candidates: usize,
    /// Timed runs per measurement (a quarter above 512 rows).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    #[command(flatten)]
    jsonl: JsonlArg,
}

/// `--preset`, for the commands that build a model of a preset shape.
#[derive(clap::Args)]
struct PresetArg {
    /// Model shape: default (small, CPU-friendly), qwen2.5-0.5b, -1.5b, -7b, -32b, -72b, -72b-tp8
    /// (one rank of tensor-parallel 8, no collective). Weights are random.
    #[arg(long, default_value = "default")]
    preset: String,
}

/// `--tensor-parallel`, for the commands that time a model's steps.
#[derive(clap::Args)]
struct TensorParallelArg {
    /// Split the model over N tensor-parallel ranks: threads, each with its own backend (a GPU
    /// each, or a share of the CPU cores) and the group's collectives, running the same timed
    /// loop in lockstep. Times are rank 0's wall times (the collectives included); FLOP/s,
    /// MFU, bytes and roofline are per rank (the model's work over N). Not with a -tpN preset
    /// (one rank's shapes already, without collectives).
    #[arg(long, default_value_t = 1, value_name = "N")]
    tensor_parallel: usize,
}

/// `--device`, for every command that picks a backend.
#[derive(clap::Args)]
struct DeviceArg {
    /// Where the model runs: auto (the GPU when there is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
}

/// `--jsonl`, for every command.
#[derive(clap::Args)]
struct JsonlArg {
    /// Also append one JSON record per row to this file (bench/peers/compare.py reads it).
    #[arg(long)]
    jsonl: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RlArgs {
    /// Model shape with the Qwen2.5 vocabulary (default: tiny on the CPU, qwen2.5-0.5b on a GPU).
    #[arg(long)]
    preset: Option<String>,
    #[command(flatten)]
    device: DeviceArg,
    /// Handoffs timed (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Tasks and rollouts per task of the iteration (default: 2 x 2 on the CPU, 8 x 8 on a GPU).
    #[arg(long)]
    tasks: Option<usize>,
    /// Rollouts per task of the iteration.
    #[arg(long)]
    group: Option<usize>,
    #[arg(long, default_value_t = 3)]
    max_turns: usize,
    /// Tokens per reply (default: 16 on the CPU, 256 on a GPU).
    #[arg(long)]
    max_turn_tokens: Option<usize>,
    #[arg(long, default_value_t = 8192)]
    max_context: usize,
    #[command(flatten)]
    jsonl: JsonlArg,
}

#[derive(clap::Args)]
struct AgentArgs {
    #[command(flatten)]
    preset: PresetArg,
    #[command(flatten)]
    device: DeviceArg,
    /// Largest context a rollout grows to (default: 640 on the CPU, 32768 on a GPU).
    #[arg(long)]
    max_context: Option<usize>,
    /// Tasks and rollouts per task (default: 2 x 4 on the CPU, 8 x 10 on a GPU).
    #[arg(long)]
    tasks: Option<usize>,
    /// Rollouts per task (G): they share the task's prompt.
    #[arg(long)]
    group: Option<usize>,
    /// Fraction of free GPU memory given to the KV cache.
    #[arg(long, default_value_t = 0.85)]
    kv_cache_fraction: f64,
    /// Also run the workload through `swerve-serve`'s HTTP API (started from this binary's
    /// folder on the same random model, written to a temporary folder; tensor-parallel size 1
    /// presets only) and report host time per generated token next to the in-process figure.
    #[arg(long)]
    http: bool,
    /// START_S,COMMAND_S: instead, episodes through the rollout workers in an environment whose
    /// sandboxes take START_S seconds to start and whose commands take COMMAND_S, with one knob
    /// (sandboxes = engine batch), separate knobs (4x the sandboxes) and a warm pool: the
    /// engine's busy fraction, episode wall time, start-up exposed and hidden.
    #[arg(long, value_parser = parse_slow_env)]
    slow_env: Option<(f64, f64)>,
    #[command(flatten)]
    jsonl: JsonlArg,
}

/// `START_S,COMMAND_S`: two non-negative numbers of seconds.
fn parse_slow_env(s: &str) -> Result<(f64, f64), String> {
    let parts: Vec<&str> = s.split(',').collect();
    let seconds = |p: &str| {
        p.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0 && *x <= 3600.0)
    };
    match parts.as_slice() {
        [a, b] => match (seconds(a), seconds(b)) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(format!(
                "{s:?}: expected START_S,COMMAND_S, seconds from 0 to 3600"
            )),
        },
        _ => Err(format!("{s:?}: expected START_S,COMMAND_S (e.g. 2,1)")),
    }
}

#[derive(clap::Args)]
struct DecodeArgs {
    #[command(flatten)]
    preset: PresetArg,
    /// Sequences per step, comma-separated (default: 1,8,32,128 on a GPU, 1,4 on the CPU).
    #[arg(long, value_delimiter = ',')]
    batch_sizes: Vec<usize>,
    /// Tokens already cached per sequence when timing starts (default: 4096 on a GPU, 256 on
    /// the CPU).
    #[arg(long)]
    context: Option<usize>,
    /// Timed steps per batch size (after two warm-ups); the median is reported.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Contexts of the decode-attention rows (GPU only), comma-separated; 0 skips them.
    #[arg(long, value_delimiter = ',', default_values_t = [4096usize, 32768, 131072])]
    attention_contexts: Vec<usize>,
    /// Run every step op by op instead of replaying captured CUDA graphs (always so with
    /// --tensor-parallel above 1, as the engine's tensor-parallel steps).
    #[arg(long)]
    no_cuda_graphs: bool,
    #[command(flatten)]
    tensor_parallel: TensorParallelArg,
    #[command(flatten)]
    device: DeviceArg,
    #[command(flatten)]
    jsonl: JsonlArg,
}

#[derive(clap::Args)]
struct TrainArgs {
    #[command(flatten)]
    preset: PresetArg,
    /// Packed tokens per step, comma-separated (default: 16384,32768 on a GPU, 256 on the CPU).
    #[arg(long, value_delimiter = ',')]
    tokens: Vec<usize>,
    /// Tokens per packed sequence (default: each step is one sequence).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Timed steps per size (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    #[command(flatten)]
    tensor_parallel: TensorParallelArg,
    #[command(flatten)]
    device: DeviceArg,
    #[command(flatten)]
    jsonl: JsonlArg,
}

#[derive(clap::Args)]
struct PlanArgs {
    /// Model shape (a preset name, as the other commands take; `-yarn4` for 131,072 tokens).
    #[arg(long, default_value = "qwen2.5-72b-yarn4")]
    preset: String,
    /// Plan for the `config.json` of this model folder instead of a preset.
    #[arg(long)]
    model: Option<PathBuf>,
    /// GPUs in all.
    #[arg(long)]
    gpus: usize,
    /// Memory of one GPU in GiB (the driver reports 79.2 for an 80 GB H100, ~140 for an H200).
    #[arg(long)]
    gpu_memory: f64,
    /// Tensor-parallel size (default: the GPUs of one 8-GPU node, gcd(gpus, 8)).
    #[arg(long)]
    tp: Option<usize>,
    /// Data-parallel replicas (default: gpus / tp).
    #[arg(long)]
    dp: Option<usize>,
    /// Tokens of the longest sequence (default: the model's context).
    #[arg(long)]
    context: Option<usize>,
    /// Training micro-batch budget (default: the context; a longer sequence runs alone).
    #[arg(long)]
    micro_batch_tokens: Option<usize>,
    /// Rollouts per task (G).
    #[arg(long, default_value_t = 10)]
    group: usize,
    /// Tasks an engine (one model replica) runs at once: the KV cache holds G x this many
    /// sequences at the full context.
    #[arg(long, default_value_t = 1)]
    tasks_in_flight: usize,
    /// Rows of one engine step.
    #[arg(long, default_value_t = 8192)]
    max_num_batched_tokens: usize,
    /// Sequences an engine step runs at once.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// rl: trainer and engine share the GPUs (the RL loop); train; serve.
    #[arg(long, default_value = "rl")]
    mode: commands::PlanMode,
    /// GiB a GPU loses to what swerve does not allocate (CUDA context, modules): an assumption.
    #[arg(long, default_value_t = 1.0)]
    reserve: f64,
    /// Streaming multiprocessors of the GPU (132 on an H100 or H200 SXM).
    #[arg(long, default_value_t = 132)]
    num_sms: usize,
}

#[derive(clap::Args)]
struct PrefillArgs {
    #[command(flatten)]
    preset: PresetArg,
    /// Sequence lengths, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [128usize, 512])]
    seq_lens: Vec<usize>,
    /// Timed runs per length (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    #[command(flatten)]
    tensor_parallel: TensorParallelArg,
    #[command(flatten)]
    device: DeviceArg,
    #[command(flatten)]
    jsonl: JsonlArg,
}

fn main() -> Result<()> {
    if let Some(banner) = swerve::backend::cuda::emulation_banner() {
        eprintln!("{banner}");
    }
    let cli = Cli::parse();
    if swerve::parse_only::requested()? {
        let matches = Cli::command().get_matches();
        let command = matches.subcommand_name().unwrap_or("prefill");
        println!("swerve-bench {command}: the arguments parse");
        return Ok(());
    }
    swerve::backend::cuda::gemm::set_exact_logprobs(cli.exact_logprobs);
    swerve::backend::cuda::gemm_rows::set_tiles_per_m(cli.exact_gemm_tiles == "per-m");
    match cli.command.unwrap_or(Command::Prefill(cli.prefill)) {
        Command::Prefill(a) => commands::prefill(&commands::PrefillOptions {
            preset: a.preset.preset,
            device: a.device.device,
            seq_lens: a.seq_lens,
            reps: a.reps,
            tensor_parallel: a.tensor_parallel.tensor_parallel,
            jsonl: a.jsonl.jsonl,
        }),
        Command::Plan(a) => commands::plan(&commands::PlanOptions {
            preset: a.preset,
            model: a.model,
            gpus: a.gpus,
            gpu_memory: a.gpu_memory,
            tp: a.tp,
            dp: a.dp,
            context: a.context,
            micro_batch_tokens: a.micro_batch_tokens,
            group: a.group,
            tasks_in_flight: a.tasks_in_flight,
            max_num_batched_tokens: a.max_num_batched_tokens,
            max_num_seqs: a.max_num_seqs,
            mode: a.mode,
            reserve: a.reserve,
            num_sms: a.num_sms,
        }),
        Command::Kernels {
            static_report: true,
            ..
        } => swerve::bench::kernel_static::print_static_report().map(|_| ()),
        Command::Kernels { jsonl, .. } => commands::kernels(jsonl.jsonl.as_deref()),
        Command::Gemm(a) => commands::gemm(&commands::GemmOptions {
            presets: a.presets,
            tensor_parallel: a.tensor_parallel,
            rows: a.rows,
            candidates: a.candidates,
            reps: a.reps,
            jsonl: a.jsonl.jsonl,
        }),
        Command::Agent(a) => commands::agent(&commands::AgentOptions {
            preset: a.preset.preset,
            device: a.device.device,
            max_context: a.max_context,
            tasks: a.tasks,
            group: a.group,
            kv_cache_fraction: a.kv_cache_fraction,
            http: a.http,
            jsonl: a.jsonl.jsonl,
            slow_env: a.slow_env,
        }),
        Command::Decode(a) => commands::decode(&commands::DecodeOptions {
            preset: a.preset.preset,
            device: a.device.device,
            batch_sizes: a.batch_sizes,
            context: a.context,
            steps: a.steps,
            attention_contexts: a.attention_contexts,
            cuda_graphs: !a.no_cuda_graphs,
            tensor_parallel: a.tensor_parallel.tensor_parallel,
            jsonl: a.jsonl.jsonl,
        }),
        Command::Train(a) => commands::train(&commands::TrainOptions {
            preset: a.preset.preset,
            device: a.device.device,
            tokens: a.tokens,
            seq_len: a.seq_len,
            reps: a.reps,
            tensor_parallel: a.tensor_parallel.tensor_parallel,
            jsonl: a.jsonl.jsonl,
        }),
        Command::Rl(a) => commands::rl(&commands::RlOptions {
            preset: a.preset,
            device: a.device.device,
            reps: a.reps,
            tasks: a.tasks,
            group: a.group,
            max_turns: a.max_turns,
            max_turn_tokens: a.max_turn_tokens,
            max_context: a.max_context,
            jsonl: a.jsonl.jsonl,
        }),
    }
}
