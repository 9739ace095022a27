//! `swerve-train rl`: the method in one process (RL-SPEC.md; DESIGN.md decision 14).
//!
//! ```text
//!   [--rft-first K: K rollouts per task with the base model, keep the resolved, RFT on them]
//!   for each iteration:
//!     tasks  = the next --tasks-per-iteration of a seeded order over the task file
//!     rollouts: --group episodes per task through the in-process engine (or --server)
//!     rewards ─ group advantages ─ drop A = 0 (and episodes that failed for infrastructure)
//!     logp_old = the trainer's own logprobs under the rollout weights (the gap to the
//!                sampler's logprobs is measured: the same backend promises 0)
//!     DAPO: optimizer steps over the kept trajectories in batches of --batch-size
//!     (the engine's KV cache is released while the trainer runs, allocated again after)
//!     handoff: the trainer's compute weights go to the engine in memory (prefix cache reset,
//!              weight version + 1), or through /v1/weights/reload with --server
//!     iterations.jsonl, metrics.jsonl (and their scalars in OUT/tb/), reward.png; a checkpoint
//!     every --save-every
//! ```
//!
//! Everything random is seeded by (--seed, iteration), so `--resume` continues exactly: the same
//! tasks, the same sampling streams, the same batches, given the options [`recorded_options`]
//! lists (each checkpoint records them; a resume that changes one is refused).

pub mod iteration;
pub mod plot;
pub mod report;
pub mod schedule;
pub mod work_queue;

use crate::agent::command::{environment_for, AgentRunOptions};
use crate::agent::episode::{EpisodeConfig, EpisodeContext};
use crate::agent::policy::{EnginePolicy, Policy, ServerPolicy};
use crate::agent::reward::SuspiciousReward;
use crate::agent::sampling::{launch_rollout_engine, ModelLimits};
use crate::backend::grad::BackendGrad;
use crate::backend::{select, DeviceChoice, Selected};
use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::dist::launch::ProcessGroupEnv;
use crate::dist::tcp::TcpComm;
use crate::dist::Collectives;
use crate::env::{builtin, load_tasks, Task};
use crate::tokenizer::Tokenizer;
use crate::train::checkpoint;
use crate::train::group::{LearnerGroup, LearnerSpec, Trainer};
use crate::train::learner::Learner;
use crate::train::optimizer::AdamWConfig;
use crate::train::run_dir::{self, decimal, RecordedOptions, RunStart};
use crate::train::tensorboard::{self, EventWriter, Series};
use anyhow::{anyhow, bail, Context, Result};
use iteration::{handoff, Loop, Progress, Sampler};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// Everything `swerve-train rl` takes.
#[derive(Clone, Debug)]
pub struct RlOptions {
    /// Rollout side: model, tasks, output, group, episode limits, environment, concurrency,
    /// seed, device, --server.
    pub agent: AgentRunOptions,
    pub iterations: usize,
    pub tasks_per_iteration: usize,
    /// Trajectories per optimizer step.
    pub batch_size: usize,
    pub lr: f64,
    pub warmup_steps: u64,
    pub weight_decay: f32,
    pub grad_clip: Option<f64>,
    pub eps_low: f32,
    pub eps_high: f32,
    pub tis_cap: Option<f32>,
    pub micro_batch_tokens: usize,
    pub save_every: usize,
    /// What to do with what is already in `agent.out` (see [`crate::train::run_dir`]).
    pub start: RunStart,
    /// RFT first: rollouts per task with the base model, then RFT on the resolved ones.
    pub rft_first: Option<usize>,
    pub rft_lr: f64,
    pub rft_warmup_steps: u64,
    /// Trajectories per RFT optimizer step.
    pub rft_batch_size: usize,
    pub rft_epochs: usize,
    /// Write every iteration's episodes, with their advantages, to
    /// `OUT/rollouts/iteration-N.jsonl`.
    pub save_rollouts: bool,
    /// Tensor-parallel ranks of the learner and of the engine (`--tensor-parallel`).
    pub tensor_parallel: usize,
    /// The optimizer state waits in host memory while the rollouts run (`--offload-optimizer`;
    /// not recorded: it changes no result).
    pub offload_optimizer: bool,
    /// `--rollout-deadline SECS`: seconds after the start of an iteration's rollouts (the RFT
    /// phase's too) past which no episode starts and those still running are stopped (their
    /// generations aborted, their sandboxes closed) and dropped from training. Counted in each
    /// line of `iterations.jsonl` (`dropped.deadline`, `episodes_past_deadline`, and the
    /// deadline itself as `rollout_deadline_s`). Not among [`recorded_options`]: what it drops
    /// depends on wall-clock time, so a resume could not repeat it anyway, and a resume may
    /// need to change it when the cluster's speed changes; the lines say which iterations ran
    /// under which deadline.
    pub rollout_deadline: Option<f64>,
}

/// Settings `rl` uses where a flag is not given: the paper's stage 1 (RL-SPEC.md), or, for
/// `builtin:toy`, a schedule the toy model learns in minutes on a CPU. Each field is named as
/// its flag (`OUT/config.toml` records these values for the flags not given).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RlDefaults {
    pub iterations: usize,
    pub tasks_per_iteration: usize,
    pub group: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub warmup_steps: u64,
    pub eps_high: f32,
    pub max_turns: usize,
    pub turn_threshold: usize,
    pub max_turn_tokens: usize,
    pub concurrency: usize,
    pub rft_first: Option<usize>,
    pub rft_lr: f64,
    pub rft_warmup_steps: u64,
    pub rft_batch_size: usize,
}

impl RlDefaults {
    pub fn for_tasks(tasks: &str) -> Self {
        if tasks == "builtin:toy" {
            // Measured on 2 cores, seeds 0-3: resolved 0.35-0.46 at the first iteration, 0.9 or
            // more from iteration 22-26, 0.98 over iterations 140-150, ~0.2 s an iteration.
            // Rejected: lr 3e-4 (stalled at 0.25), 6 turns with threshold 3 and a required
            // submit after "correct" (collapsed to deterministic partial policies at 0.5-0.75).
            Self {
                iterations: 60,
                tasks_per_iteration: 8,
                group: 16,
                batch_size: 32,
                lr: 1e-3,
                warmup_steps: 0,
                eps_high: 0.3,
                max_turns: 8,
                turn_threshold: 4,
                max_turn_tokens: 1,
                concurrency: 64,
                rft_first: Some(64),
                rft_lr: 1e-3,
                rft_warmup_steps: 0,
                rft_batch_size: 32,
            }
        } else {
            Self {
                iterations: 100,
                tasks_per_iteration: 300,
                group: 10,
                batch_size: 128,
                lr: 1e-6,
                warmup_steps: 10,
                eps_high: 0.3,
                max_turns: 40,
                turn_threshold: 10,
                max_turn_tokens: 4096,
                concurrency: 64,
                rft_first: None,
                rft_lr: 5e-6,
                rft_warmup_steps: 10,
                rft_batch_size: 64,
            }
        }
    }
}

/// `swerve-train rl`: picks the device (the trainer's and the engine's), then [`run`].
/// With `--tensor-parallel N` the learner's ranks run on threads of their own
/// ([`LearnerGroup`]) and the engine is tensor-parallel too ([`crate::engine::TpEngine`]).
pub fn run_on_device(device: DeviceChoice, options: &RlOptions) -> Result<()> {
    let process = ProcessGroupEnv::from_env()?;
    if process.world_size > 1 {
        return run_across_processes(device, options, process);
    }
    if options.tensor_parallel > 1 {
        let setup = setup(options, true)?;
        let spec = learner_spec(options, &setup);
        let group = LearnerGroup::start(device, options.tensor_parallel, process, spec)?;
        return run_loop(group, options, setup, None);
    }
    let (backend, line) = select(device)?;
    eprintln!("{line}");
    match backend {
        Selected::Cpu(b) => run(&b, options),
        Selected::Cuda(b) => run(&*b, options),
    }
}

/// The loop with one process per node (torchrun's or Slurm's variables): each runs its own
/// engine (`--tensor-parallel` over its GPUs) on the task groups it takes from process 0's
/// queue whenever it has room ([`work_queue`]), the processes exchange the episodes, and every process trains on all of them as one replica of
/// a data-parallel learner (gradients summed across nodes, ZeRO-1). The first process prepares
/// OUT and the starting model and writes the logs; checkpoints are written together.
fn run_across_processes(
    device: DeviceChoice,
    options: &RlOptions,
    process: ProcessGroupEnv,
) -> Result<()> {
    if options.agent.server.is_some() {
        bail!("--server with a multi-process launch: every process samples from its own engine; drop --server");
    }
    eprintln!("rl: {process}");
    let (comm, _) = TcpComm::connect(&process, b"swerve-train rl")?;
    let first = process.rank == 0;
    // The others wait for the first to check OUT and write a preset's model.
    let prepared = if first {
        Some(setup(options, true))
    } else {
        None
    };
    let mut ok = vec![u8::from(prepared.as_ref().is_none_or(|p| p.is_ok()))];
    comm.broadcast_bytes(&mut ok, 0)?;
    let setup = match prepared {
        Some(setup) => setup?,
        None if ok == [1] => setup(options, false)?,
        None => bail!("the first process could not prepare the run (its log says why)"),
    };
    // Every process must run the same loop on the same tasks.
    let record = recorded_options(options, &setup.tasks_content, &setup.episode);
    let mine = record.to_json().to_string();
    let all = comm.all_gather_bytes(mine.as_bytes())?;
    if let Some(r) = all.iter().position(|o| o.as_slice() != mine.as_bytes()) {
        bail!(
            "process {r} runs other options or tasks than process {}: {}",
            process.rank,
            String::from_utf8_lossy(&all[r])
        );
    }
    let queue = work_queue::QueueAddress::for_process_group(&process, options.tensor_parallel)?;
    let spec = learner_spec(options, &setup);
    let group = LearnerGroup::start(device, options.tensor_parallel, process, spec)?;
    let processes = iteration::Processes {
        comm: &comm,
        queue: &queue,
    };
    run_loop(group, options, setup, Some(processes))
}

fn learner_spec(options: &RlOptions, setup: &Setup) -> LearnerSpec {
    LearnerSpec {
        model_dir: setup.model_dir.clone(),
        adamw: adamw_config(options),
        micro_batch_tokens: options.micro_batch_tokens,
        checkpoint_layers: true,
        offload_optimizer: options.offload_optimizer,
    }
}

fn adamw_config(options: &RlOptions) -> AdamWConfig {
    AdamWConfig {
        weight_decay: options.weight_decay,
        max_grad_norm: options.grad_clip,
        ..AdamWConfig::default()
    }
}

/// The options a `--resume` must repeat, and why each: `model`, `tasks` (length and FNV-1a hash
/// of the task file), `seed`, `group`, `tasks-per-iteration` decide which episodes each
/// iteration runs; `max-turns`, `turn-threshold`, `max-context` (as resolved from the model),
/// `max-turn-tokens`, `observation-bytes` how they run and what they are rewarded (and
/// `suspicious-reward`, recorded only when not `keep`, and `swebench-rules`, only when not `5`,
/// so runs from before them resume); `batch-size`,
/// `lr`, `warmup-steps`, `weight-decay`, `grad-clip`, `eps-low`, `eps-high`, `tis-cap`,
/// `adamw` each update; `rft-first`, `rft-lr`, `rft-warmup-steps`, `rft-batch-size`,
/// `rft-epochs` the phase before iteration 1.
///
/// Free to change: `--iterations` (nothing depends on the total: a resume may extend a run),
/// `--save-every`, `--concurrency`, `--sandboxes`, `--warm-pool`, `--micro-batch-tokens`,
/// `--device`, `--server`, `--offload-optimizer` (an exact round trip through host memory),
/// `--rollout-deadline` (see [`RlOptions::rollout_deadline`]), and the sandbox's settings (`--env`, limits, binds, image): where commands run, not the method.
pub fn recorded_options(
    options: &RlOptions,
    tasks: &crate::jsonl::ContentHash,
    episode: &EpisodeConfig,
) -> RecordedOptions {
    let (agent, adamw) = (&options.agent, AdamWConfig::default());
    let model = agent.model.as_deref().map(run_dir::model_source);
    let recorded = RecordedOptions::new()
        .with("command", "rl")
        .with("model", model)
        .with("tasks", tasks.to_string())
        .with("seed", agent.seed)
        .with("group", agent.group)
        .with("tasks-per-iteration", options.tasks_per_iteration)
        .with("max-turns", episode.max_turns)
        .with("turn-threshold", episode.turn_threshold)
        .with("max-context", episode.max_context)
        .with("max-turn-tokens", episode.max_turn_tokens)
        .with("observation-bytes", episode.observation_bytes)
        .with("batch-size", options.batch_size)
        .with("lr", options.lr)
        .with("warmup-steps", options.warmup_steps)
        .with("weight-decay", decimal(options.weight_decay))
        .with("grad-clip", options.grad_clip)
        .with("eps-low", decimal(options.eps_low))
        .with("eps-high", decimal(options.eps_high))
        .with("tis-cap", options.tis_cap.map(decimal))
        .with("rft-first", options.rft_first)
        .with("rft-lr", options.rft_lr)
        .with("rft-warmup-steps", options.rft_warmup_steps)
        .with("rft-batch-size", options.rft_batch_size)
        .with("rft-epochs", options.rft_epochs)
        .with(
            "adamw",
            json!({"beta1": decimal(adamw.beta1), "beta2": decimal(adamw.beta2), "eps": decimal(adamw.eps)}),
        );
    let recorded = match episode.suspicious_reward {
        SuspiciousReward::Keep => recorded,
        other => recorded.with("suspicious-reward", other.as_str()),
    };
    match agent.swebench_rules {
        crate::env::HarnessRules::V5 => recorded,
        other => recorded.with("swebench-rules", other.as_str()),
    }
}

/// What the run needs from its model folder and task file.
struct Setup {
    model_dir: std::path::PathBuf,
    tasks: Vec<Task>,
    tasks_content: crate::jsonl::ContentHash,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    episode: EpisodeConfig,
    stop_ids: Vec<u32>,
}

fn check_options(options: &RlOptions) -> Result<()> {
    if options.iterations == 0
        || options.tasks_per_iteration == 0
        || options.batch_size == 0
        || options.rft_batch_size == 0
        || options.rft_epochs == 0
    {
        bail!("--iterations, --tasks-per-iteration, --batch-size, --rft-batch-size and --rft-epochs must be at least 1");
    }
    for (name, v) in [("--lr", options.lr), ("--rft-lr", options.rft_lr)] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{name} {v}: expected a positive number");
        }
    }
    Ok(())
}

/// Checks OUT (see [`run_dir`]; only with `prepare_out`: the process that writes), resolves the
/// model (`preset:` into OUT/base-model), loads the tasks and the tokenizer, and sets the
/// episodes' context from the model's.
fn setup(options: &RlOptions, prepare_out: bool) -> Result<Setup> {
    let agent = &options.agent;
    check_options(options)?;
    if prepare_out {
        run_dir::prepare(&agent.out, options.start)?;
    }
    let model_arg = agent
        .model
        .as_ref()
        .ok_or_else(|| anyhow!("rl needs --model DIR or --model preset:NAME"))?;
    let model_dir = run_dir::resolve_model(model_arg, &agent.out)?;
    let tasks_path = builtin::resolve_tasks(&agent.tasks)?;
    let mut tasks = load_tasks(&tasks_path)?;
    agent.swebench_rules.apply(&mut tasks);
    let tasks_content = crate::jsonl::hash_file(&tasks_path)?;
    let tokenizer = Arc::new(Tokenizer::for_model_dir(&model_dir)?);
    let template = ChatTemplate::for_tokenizer(&tokenizer)?;
    let limits = ModelLimits::new(
        &ModelConfig::from_dir(&model_dir)?,
        &tokenizer,
        agent.max_context,
    )?;
    let mut episode: EpisodeConfig = agent.episode.clone();
    episode.max_context = limits.max_context;
    let stop_ids = limits.stop_ids;
    Ok(Setup {
        model_dir,
        tasks,
        tasks_content,
        tokenizer,
        template,
        episode,
        stop_ids,
    })
}

/// Where a run starts: after the latest iteration checkpoint (restored into `learner`) with
/// `--resume`, else at the beginning. Logs beyond the checkpoint (JSON lines and event files) are
/// trimmed; a `--resume` without a checkpoint starts over.
fn resume_from_checkpoint<T: Trainer>(
    options: &RlOptions,
    record: &RecordedOptions,
    learner: &mut T,
    writer: bool,
) -> Result<(usize, Progress, bool)> {
    let out = &options.agent.out;
    let (iterations_path, metrics_path) = (out.join("iterations.jsonl"), out.join("metrics.jsonl"));
    let events = out.join(tensorboard::DIR);
    if options.start != RunStart::Resume {
        return Ok((1, Progress::default(), options.rft_first.is_none()));
    }
    let Some(dir) = checkpoint::latest_named(out, "iteration-")? else {
        // Killed before its first checkpoint: nothing to continue, so start over.
        for path in [&iterations_path, &metrics_path] {
            if writer && path.exists() {
                std::fs::remove_file(path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
        if writer {
            tensorboard::trim(
                &events,
                &[(Series::Iterations, None), (Series::Metrics, None)],
            )?;
        }
        eprintln!(
            "rl: --resume: no checkpoint in {} yet; starting from the beginning",
            out.display()
        );
        return Ok((1, Progress::default(), options.rft_first.is_none()));
    };
    record.check_resume(&checkpoint::read_state(&dir)?, &dir)?;
    let state = learner.restore(&dir)?;
    let done = state["iteration"]
        .as_u64()
        .context("trainer_state.json: no iteration")?;
    let progress = Progress {
        step: state["step"].as_u64().unwrap_or(0),
        // Checkpoints from before DAPO counted its own steps: every step was DAPO's.
        dapo_step: state["dapo_step"]
            .as_u64()
            .or(state["step"].as_u64())
            .unwrap_or(0),
        weight_version: state["weight_version"].as_u64().unwrap_or(0),
    };
    if writer {
        keep_lines(&iterations_path, "iteration", done)?;
        keep_lines(&metrics_path, "step", progress.step)?;
        let last_kept = [
            (Series::Iterations, Some(done)),
            (Series::Metrics, Some(progress.step)),
        ];
        tensorboard::trim(&events, &last_kept)?;
    }
    eprintln!("rl: resuming after iteration {done} from {}", dir.display());
    Ok((done as usize + 1, progress, true))
}

/// [`resume_from_checkpoint`], then the run's resolved configuration to OUT/config.toml: only
/// once a resume's check has passed, so a refused resume leaves the run's own.
fn resume<T: Trainer>(
    options: &RlOptions,
    record: &RecordedOptions,
    learner: &mut T,
    writer: bool,
) -> Result<(usize, Progress, bool)> {
    let start = resume_from_checkpoint(options, record, learner, writer)?;
    if let (true, Some(text)) = (writer, &options.agent.resolved_config) {
        run_dir::write_config(&options.agent.out, text)?;
    }
    Ok(start)
}

/// Runs `rl` on the trainer's backend.
pub fn run<B: BackendGrad>(backend: &B, options: &RlOptions) -> Result<()> {
    let setup = setup(options, true)?;
    let mut learner = Learner::new(
        backend,
        &setup.model_dir,
        adamw_config(options),
        options.micro_batch_tokens,
        true,
    )?;
    learner.offload_optimizer = options.offload_optimizer;
    run_loop(learner, options, setup, None)
}

/// The loop over `learner`, whatever its parallelism; `processes`: the other processes of a
/// multi-node run.
fn run_loop<T: Trainer>(
    mut learner: T,
    options: &RlOptions,
    setup: Setup,
    processes: Option<iteration::Processes<'_>>,
) -> Result<()> {
    let agent = &options.agent;
    let record = recorded_options(options, &setup.tasks_content, &setup.episode);
    let writer = processes.is_none_or(|p| p.comm.rank() == 0);
    let (first_iteration, progress, rft_done) = resume(options, &record, &mut learner, writer)?;
    let sampler = match &agent.server {
        Some(url) => Sampler::Server {
            policy: ServerPolicy::new(url, agent.api_key.clone(), setup.stop_ids.clone())?,
            url: url.clone(),
        },
        None => Sampler::Engine(Arc::new(launch_rollout_engine(
            &setup.model_dir,
            agent.device,
            setup.episode.max_context,
            agent.concurrency,
            agent.seed,
            options.tensor_parallel,
        )?)),
    };
    let env = environment_for(&setup.tasks, agent)?;
    if first_iteration > 1 {
        // The engine starts from the base model: hand it the resumed weights.
        handoff(&learner, &sampler, &setup.model_dir, &agent.out)?;
    }
    let engine_policy;
    let policy: &dyn Policy = match &sampler {
        Sampler::Engine(handle) => {
            engine_policy = EnginePolicy {
                engine: handle.clone(),
                stop_ids: setup.stop_ids.clone(),
                temperature: 1.0,
            };
            &engine_policy
        }
        Sampler::Server { policy, .. } => policy,
    };
    let ctx = EpisodeContext {
        env: env.as_ref(),
        policy,
        tokenizer: &setup.tokenizer,
        template: &setup.template,
        config: &setup.episode,
    };
    eprintln!(
        "rl: {} tasks from {}, {} per iteration x {} rollouts, {} iterations, batch {}, lr {}, environment {}, context {}",
        setup.tasks.len(),
        agent.tasks,
        options.tasks_per_iteration,
        agent.group,
        options.iterations,
        options.batch_size,
        options.lr,
        env.name(),
        setup.episode.max_context
    );
    if let (false, Some(k)) = (rft_done, options.rft_first) {
        eprintln!(
            "rl: RFT phase first: {k} rollouts per task with the base model, then {} epoch(s) over the resolved ones: {}",
            options.rft_epochs,
            schedule::PhaseSchedule::rft(
                options.rft_lr,
                options.rft_warmup_steps,
                options.rft_batch_size,
                options.rft_epochs,
                0
            )
            .describe()
        );
    }
    eprintln!(
        "rl: DAPO schedule: {} (steps counted from DAPO's first)",
        schedule::PhaseSchedule::dapo(options.lr, options.warmup_steps, options.batch_size)
            .describe()
    );
    let mut run = Loop {
        options,
        learner,
        sampler: &sampler,
        ctx: &ctx,
        tasks: &setup.tasks,
        model_dir: &setup.model_dir,
        record: &record,
        progress,
        history: read_history(&agent.out.join("iterations.jsonl"))?,
        processes,
        tensorboard: EventWriter::for_run(&agent.out, writer)?,
    };
    if let (false, Some(k)) = (rft_done, options.rft_first) {
        run.rft_phase(k)?;
    }
    for iteration in first_iteration..=options.iterations {
        run.iteration(iteration)?;
    }
    Ok(())
}

/// Keeps the lines of `path` whose `key` is at most `last` (a resumed run rewrites the rest).
fn keep_lines(path: &Path, key: &str, last: u64) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .and_then(|v| v[key].as_u64())
                .is_some_and(|v| v <= last)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, kept).with_context(|| format!("rewriting {}", path.display()))
}

fn read_history(path: &Path) -> Result<Vec<Value>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(Vec::new());
    };
    text.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: a bad line", path.display())))
        .collect()
}
