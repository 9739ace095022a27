//! `swerve-train rft` and `dapo`: the training loop over [`BackendGrad`].
//!
//! ```text
//! OUT checked (run_dir: empty, --resume or --overwrite) ─ starting model (preset: OUT/base-model)
//! read data line by line into packed arrays ─ (dapo) group advantages, drop A = 0
//! (--resume) the latest checkpoint's recorded options must equal this run's
//! (dapo) old logprobs: recompute with the starting weights, or the data's rollout logprobs
//! for each optimizer step (batch = `batch_size` trajectories, epoch order shuffled by a seed):
//!     N_act = the batch's action tokens (before any split)
//!     for each micro-batch (packed up to `micro_batch_tokens`):
//!         forward (checkpointed) ─ fused loss / N_act ─ backward, gradients accumulate
//!     AdamW on the f32 masters (clipped; skipped on NaN/Inf) ─ refresh compute weights
//!     append metrics.jsonl and its scalars to OUT/tb/; every `save_every` steps a checkpoint
//!     with resume state
//! ```
//!
//! Step `s` always trains the same trajectories (epoch `(s-1) / steps_per_epoch`, position
//! `(s-1) % steps_per_epoch` of that epoch's seeded order), so `--resume` needs only the step,
//! the masters and the moments to continue exactly as an uninterrupted run, given the options
//! [`recorded_options`] lists (checked, never assumed).

use crate::backend::grad::BackendGrad;
use crate::backend::DeviceChoice;
use crate::dist::grid::{run_grid, GridSpec, RankPlace, RankTask};
use crate::dist::launch::ProcessGroupEnv;
use crate::dist::tcp::TcpComm;
use crate::dist::{Collectives, Groups};
use crate::train::checkpoint;
use crate::train::data::{self, DataFile, TrainSequence};
use crate::train::learner::Learner;
use crate::train::loss::Objective;
use crate::train::optimizer::{lr_at, AdamWConfig, LrSchedule};
use crate::train::run_dir::{self, decimal, RecordedOptions, RunStart};
use crate::train::tensorboard::{self, EventWriter, Series};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

/// Where DAPO's `logp_old` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OldLogprobs {
    /// The trainer scores every trajectory with the starting weights before the first update.
    Recompute,
    /// The data's `logprobs` (the sampler's).
    Rollout,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    Rft,
    Dapo {
        eps_low: f32,
        eps_high: f32,
        old_logprobs: OldLogprobs,
        tis_cap: Option<f32>,
    },
}

#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// `--model` as given: a folder or `preset:NAME`.
    pub model: PathBuf,
    pub data: PathBuf,
    pub out: PathBuf,
    pub algorithm: Algorithm,
    pub lr: f64,
    pub lr_schedule: LrSchedule,
    pub warmup_steps: u64,
    pub weight_decay: f32,
    /// Global-norm clipping; `None`: off.
    pub grad_clip: Option<f64>,
    /// Trajectories per optimizer step (after dropping zero-advantage ones).
    pub batch_size: usize,
    pub micro_batch_tokens: usize,
    pub epochs: usize,
    /// Stop after this many optimizer steps (default: every epoch's batches); the length of the
    /// learning-rate schedule.
    pub steps: Option<u64>,
    /// Longest trajectory accepted (default: the model's context).
    pub max_seq_len: Option<usize>,
    pub save_every: Option<u64>,
    /// What to do with what is already in `out` (see [`run_dir`]).
    pub start: RunStart,
    /// Activation checkpointing per layer.
    pub checkpoint_layers: bool,
    /// Seeds each epoch's trajectory order.
    pub seed: u64,
    /// A progress line on stderr (when it is a terminal).
    pub progress: bool,
    /// Tensor-parallel ranks per replica and data-parallel replicas in this process (the
    /// process group, from the environment, multiplies the replicas).
    pub parallel: Parallel,
    /// Every flag's final value as TOML ([`crate::cli::ResolvedConfig`]), written to
    /// `OUT/config.toml` once OUT is ready and a resume's check has passed; `None`: no file.
    pub resolved_config: Option<String>,
}

/// `--tensor-parallel N --data-parallel M`: this process runs `M` replicas of `N` ranks, a thread
/// (and GPU) each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parallel {
    pub tensor: usize,
    pub data: usize,
}

impl Default for Parallel {
    fn default() -> Self {
        Self { tensor: 1, data: 1 }
    }
}

impl Parallel {
    /// The grid this process runs, with the process group read from the environment
    /// (torchrun's or Slurm's variables; one process without them).
    pub fn grid(self) -> Result<GridSpec> {
        if self.tensor == 0 || self.data == 0 {
            bail!("--tensor-parallel and --data-parallel must be at least 1");
        }
        Ok(GridSpec {
            tp: self.tensor,
            dp_local: self.data,
            process: ProcessGroupEnv::from_env()?,
        })
    }
}

#[derive(Clone, Debug, Default)]
pub struct TrainSummary {
    pub steps: u64,
    pub skipped_steps: u64,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    pub final_dir: PathBuf,
}

/// The trajectory indices of epoch `epoch`, shuffled by a SplitMix64 stream seeded from
/// `(seed, epoch)` (Fisher-Yates), the same on every machine.
fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    use crate::rng::{Rng, SplitMix64, GOLDEN_GAMMA};
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::new(seed ^ epoch.wrapping_mul(GOLDEN_GAMMA) ^ 0x5EED).shuffle(&mut order);
    order
}

/// `swerve-train rft` / `dapo`: picks the device, trains on every rank of the grid, prints a
/// summary line.
pub fn run(device: DeviceChoice, options: &TrainOptions) -> Result<TrainSummary> {
    let spec = options.parallel.grid()?;
    let prepared = Prepared::new(options, &spec)?;
    let task = TrainRank {
        opts: options,
        prepared: &prepared,
        process_rank: spec.process.rank,
    };
    // Every rank ends with the same summary; the first is the writer's.
    let summary = run_grid(device, &spec, &task)?.swap_remove(0);
    if spec.process.rank == 0 {
        eprintln!(
            "trained {} steps ({} skipped); loss {} -> {}; model in {}",
            summary.steps,
            summary.skipped_steps,
            summary.first_loss.map_or("-".into(), |l| format!("{l:.4}")),
            summary.last_loss.map_or("-".into(), |l| format!("{l:.4}")),
            summary.final_dir.display()
        );
    }
    Ok(summary)
}

/// The options a `--resume` must repeat, and why each:
///
/// - `command`, `eps-low`, `eps-high`, `old-logprobs`, `tis-cap`: the objective every step
///   minimises;
/// - `model`: the starting weights (also what `recompute` scores old logprobs with);
/// - `data`: the trajectories (length and FNV-1a hash of the file's bytes; the path may change);
/// - `batch-size`, `seed`: which trajectories step `s` trains;
/// - `epochs`, `steps`: the schedule's length, so every step's learning rate;
/// - `lr`, `lr-schedule`, `warmup-steps`, `weight-decay`, `grad-clip`, `adamw`: each update.
///
/// Free to change: `--micro-batch-tokens` and `--no-activation-checkpointing` (memory, not the
/// step), `--max-seq-len` (a check), `--save-every`, `--device`, and the data file's location.
pub fn recorded_options(opts: &TrainOptions, data: &crate::jsonl::ContentHash) -> RecordedOptions {
    let adamw = AdamWConfig::default();
    let mut record = RecordedOptions::new()
        .with(
            "command",
            match opts.algorithm {
                Algorithm::Rft => "rft",
                Algorithm::Dapo { .. } => "dapo",
            },
        )
        .with("model", run_dir::model_source(&opts.model))
        .with("data", data.to_string());
    if let Algorithm::Dapo {
        eps_low,
        eps_high,
        old_logprobs,
        tis_cap,
    } = opts.algorithm
    {
        let old = match old_logprobs {
            OldLogprobs::Recompute => "recompute",
            OldLogprobs::Rollout => "rollout",
        };
        record = record
            .with("eps-low", decimal(eps_low))
            .with("eps-high", decimal(eps_high))
            .with("old-logprobs", old)
            .with("tis-cap", tis_cap.map(decimal));
    }
    record
        .with("batch-size", opts.batch_size)
        .with("seed", opts.seed)
        .with("epochs", opts.epochs)
        .with("steps", opts.steps)
        .with("lr", opts.lr)
        .with(
            "lr-schedule",
            match opts.lr_schedule {
                LrSchedule::Constant => "constant",
                LrSchedule::Cosine => "cosine",
            },
        )
        .with("warmup-steps", opts.warmup_steps)
        .with("weight-decay", decimal(opts.weight_decay))
        .with("grad-clip", opts.grad_clip)
        .with(
            "adamw",
            json!({"beta1": decimal(adamw.beta1), "beta2": decimal(adamw.beta2), "eps": decimal(adamw.eps)}),
        )
}

/// The trajectories a run trains on (those with a non-zero advantage).
struct TrainingSet {
    data: DataFile,
    /// (trajectory index, advantage), in file order.
    kept: Vec<(usize, f64)>,
}

/// DAPO `recompute`: the kept trajectories' row-form logprobs under the starting weights, packed
/// (kept trajectory `k`'s rows at `starts[k]..starts[k + 1]`); empty otherwise.
#[derive(Default)]
struct Recomputed {
    rows: Vec<f32>,
    starts: Vec<usize>,
}

/// Reads the data and computes the advantages; a DAPO run that needs the data's logprobs checks
/// they are there.
fn load_training_set(
    opts: &TrainOptions,
    model_dir: &Path,
    vocab_size: usize,
    max_seq_len: usize,
) -> Result<TrainingSet> {
    let is_dapo = matches!(opts.algorithm, Algorithm::Dapo { .. });
    let data = data::read_trajectories(&opts.data, model_dir, vocab_size, max_seq_len, !is_dapo)?;
    let set = &data.trajectories;
    let advantages = if is_dapo {
        data::group_advantages(&set.group_rewards(), |i| set.location(i))?
    } else {
        vec![1.0; set.len()]
    };
    let kept: Vec<(usize, f64)> = advantages
        .into_iter()
        .enumerate()
        .filter(|&(_, a)| a != 0.0)
        .collect();
    if kept.is_empty() {
        bail!(
            "{}: every trajectory has zero advantage (all groups' rewards are equal)",
            opts.data.display()
        );
    }
    if let Algorithm::Dapo {
        old_logprobs,
        tis_cap,
        ..
    } = opts.algorithm
    {
        let needs_rollout = old_logprobs == OldLogprobs::Rollout || tis_cap.is_some();
        if let Some(&(i, _)) = kept
            .iter()
            .find(|&&(i, _)| needs_rollout && !set.has_rollout_logprobs(i))
        {
            bail!(
                "{}: --old-logprobs rollout and --tis-cap need the data's `logprobs`",
                set.location(i)
            );
        }
    }
    Ok(TrainingSet { data, kept })
}

/// DAPO `recompute`: scores every kept trajectory with the learner's (starting) weights, one
/// micro-batch at a time (the packing `score` would use over all of them).
fn recompute_old_logprobs<B: BackendGrad>(
    learner: &Learner<'_, B>,
    set: &TrainingSet,
) -> Result<Recomputed> {
    let trajectories = &set.data.trajectories;
    let lengths: Vec<usize> = set
        .kept
        .iter()
        .map(|&(i, _)| trajectories.tokens(i).len())
        .collect();
    let mut out = Recomputed {
        rows: Vec::new(),
        starts: vec![0],
    };
    for micro in data::pack_micro_batches(&lengths, learner.micro_batch_tokens) {
        let sequences: Vec<TrainSequence> = set.kept[micro]
            .iter()
            .map(|&(i, a)| trajectories.train_sequence(i, a))
            .collect();
        for rows in learner.logprobs(&sequences.iter().collect::<Vec<_>>())? {
            out.rows.extend_from_slice(&rows);
            out.starts.push(out.rows.len());
        }
    }
    Ok(out)
}

/// Where a `--resume` continues: the latest checkpoint (`step-N/` or `final/`) whose recorded
/// options equal `record`; `None` (start over, its metrics dropped by the `writer`) when there
/// is none.
fn resume_checkpoint(
    opts: &TrainOptions,
    record: &RecordedOptions,
    writer: bool,
) -> Result<Option<PathBuf>> {
    let metrics = opts.out.join("metrics.jsonl");
    let Some((dir, state)) = checkpoint::latest_with_final(&opts.out)? else {
        if !writer {
            return Ok(None);
        }
        if metrics.exists() {
            eprintln!(
                "--resume: no checkpoint in {} yet; starting from the beginning",
                opts.out.display()
            );
        }
        truncate_logs(&opts.out, 0)?;
        return Ok(None);
    };
    record.check_resume(&state, &dir)?;
    Ok(Some(dir))
}

/// What every process prepares once for its ranks: the output folder (the first process), the
/// starting model, the data, the options a resume must repeat and where it resumes from.
struct Prepared {
    model_dir: PathBuf,
    set: TrainingSet,
    record: RecordedOptions,
    resume_from: Option<PathBuf>,
}

impl Prepared {
    fn new(opts: &TrainOptions, spec: &GridSpec) -> Result<Self> {
        if opts.batch_size == 0 || opts.micro_batch_tokens == 0 || opts.epochs == 0 {
            bail!("--batch-size, --micro-batch-tokens and --epochs must be positive");
        }
        let first = spec.process.rank == 0;
        // The other processes wait for the first to check OUT and write a preset's model.
        let processes = (spec.process.world_size > 1)
            .then(|| TcpComm::connect(&spec.process, b"swerve-train"))
            .transpose()?;
        if first {
            run_dir::prepare(&opts.out, opts.start)?;
        }
        let model_dir = if first {
            run_dir::resolve_model(&opts.model, &opts.out)
        } else {
            Ok(PathBuf::new())
        };
        if let Some((comm, _)) = &processes {
            let mut ok = vec![u8::from(model_dir.is_ok())];
            comm.broadcast_bytes(&mut ok, 0)?;
            if ok != [1] {
                bail!("the first process could not prepare the run (its log says why)");
            }
        }
        let model_dir = if first {
            model_dir?
        } else {
            run_dir::resolve_model(&opts.model, &opts.out)?
        };
        let config = crate::config::ModelConfig::from_dir(&model_dir)?;
        let max_seq_len = opts.max_seq_len.unwrap_or(config.max_context());
        let set = load_training_set(opts, &model_dir, config.vocab_size, max_seq_len)?;
        let record = recorded_options(opts, &set.data.content);
        if let Some((comm, _)) = &processes {
            // Every process must run the same command on the same data.
            let mine = record.to_json().to_string();
            let all = comm.all_gather_bytes(mine.as_bytes())?;
            if let Some(r) = all.iter().position(|o| o.as_slice() != mine.as_bytes()) {
                bail!(
                    "process {r} runs other options or data than process {}: {}",
                    spec.process.rank,
                    String::from_utf8_lossy(&all[r])
                );
            }
        }
        let resume_from = match opts.start {
            RunStart::Resume => resume_checkpoint(opts, &record, first)?,
            RunStart::Fresh | RunStart::Overwrite => None,
        };
        if let (true, Some(text)) = (first, &opts.resolved_config) {
            run_dir::write_config(&opts.out, text)?;
        }
        Ok(Self {
            model_dir,
            set,
            record,
            resume_from,
        })
    }
}

/// One rank's training (SPMD): its learner, the recomputed old logprobs, the resume, the steps.
struct TrainRank<'a> {
    opts: &'a TrainOptions,
    prepared: &'a Prepared,
    process_rank: usize,
}

impl RankTask for TrainRank<'_> {
    type Output = TrainSummary;

    fn run<B: BackendGrad + 'static>(
        &self,
        backend: &B,
        groups: Groups<B>,
        _place: RankPlace,
    ) -> Result<TrainSummary> {
        let (opts, prepared) = (self.opts, self.prepared);
        let config = AdamWConfig {
            weight_decay: opts.weight_decay,
            max_grad_norm: opts.grad_clip,
            ..AdamWConfig::default()
        };
        let mut learner = Learner::new_in(
            backend,
            &prepared.model_dir,
            config,
            opts.micro_batch_tokens,
            opts.checkpoint_layers,
            &groups,
        )?;
        let writer = groups.is_writer() && self.process_rank == 0;
        // Old logprobs come from the starting weights, also on resume.
        let recomputed = match opts.algorithm {
            Algorithm::Dapo {
                old_logprobs: OldLogprobs::Recompute,
                ..
            } => recompute_old_logprobs(&learner, &prepared.set)?,
            _ => Recomputed::default(),
        };
        let mut first_step = 1;
        if let Some(dir) = &prepared.resume_from {
            let state = learner.restore(dir)?;
            let step = state["step"]
                .as_u64()
                .context("trainer_state.json: no step")?;
            first_step = step + 1;
            if writer {
                truncate_logs(&opts.out, step)?;
                eprintln!("resuming after step {step} from {}", dir.display());
            }
        }
        let tensorboard = EventWriter::for_run(&opts.out, writer)?;
        let set = &prepared.set;
        let steps_per_epoch = set.kept.len().div_ceil(opts.batch_size) as u64;
        let total_steps = opts
            .steps
            .unwrap_or(u64::MAX)
            .min(steps_per_epoch * opts.epochs as u64);
        let run = Run {
            opts,
            model_dir: &prepared.model_dir,
            set,
            recomputed: &recomputed,
            record: &prepared.record,
            steps_per_epoch,
            total_steps,
            writer,
            tensorboard,
        };
        run.steps(&mut learner, first_step)
    }
}

/// A run's fixed parts, for the step loop.
struct Run<'a> {
    opts: &'a TrainOptions,
    model_dir: &'a Path,
    set: &'a TrainingSet,
    recomputed: &'a Recomputed,
    record: &'a RecordedOptions,
    steps_per_epoch: u64,
    total_steps: u64,
    /// This rank writes the metrics and prints progress (every rank writes checkpoints
    /// together: [`Learner::save`]).
    writer: bool,
    /// The writer's event file.
    tensorboard: Option<EventWriter>,
}

impl Run<'_> {
    /// `trainer_state.json` after `step` (see [`checkpoint`]).
    fn state(&self, step: u64, updates: u64) -> Value {
        json!({
            "step": step,
            "updates": updates,
            "epoch": step.saturating_sub(1) / self.steps_per_epoch,
            "batch_in_epoch": step.saturating_sub(1) % self.steps_per_epoch,
            "total_steps": self.total_steps,
            "seed": self.opts.seed,
            "data_path": self.opts.data.display().to_string(),
            "options": self.record.to_json(),
        })
    }

    /// The kept-trajectory positions step `step` trains.
    fn batch(&self, step: u64) -> Vec<usize> {
        let epoch = (step - 1) / self.steps_per_epoch;
        let position = ((step - 1) % self.steps_per_epoch) as usize;
        let order = epoch_order(self.set.kept.len(), self.opts.seed, epoch);
        order
            .iter()
            .skip(position * self.opts.batch_size)
            .take(self.opts.batch_size)
            .copied()
            .collect()
    }

    /// Steps `first_step..=total_steps`, then the final checkpoint.
    fn steps<B: BackendGrad>(
        &self,
        learner: &mut Learner<'_, B>,
        first_step: u64,
    ) -> Result<TrainSummary> {
        let opts = self.opts;
        let mut summary = TrainSummary {
            steps: first_step - 1,
            ..TrainSummary::default()
        };
        let metrics_path = opts.out.join("metrics.jsonl");
        let show_progress = self.writer && opts.progress && std::io::stderr().is_terminal();
        let objective = objective_of(&opts.algorithm);
        for step in first_step..=self.total_steps {
            let metrics = self.step(learner, &objective, step, &mut summary)?;
            if self.writer {
                append_line(&metrics_path, &metrics)?;
            }
            if let Some(events) = &self.tensorboard {
                events.write_line(Series::Metrics, &metrics)?;
            }
            if show_progress {
                eprint!(
                    "\rstep {step}/{}  loss {}  grad norm {}  {:.0} tokens/s   ",
                    self.total_steps,
                    metrics["loss"],
                    metrics["grad_norm"],
                    metrics["tokens_per_s"].as_f64().unwrap_or(0.0)
                );
            }
            summary.steps = step;
            if opts.save_every.is_some_and(|n| n > 0 && step % n == 0) {
                let dir = opts.out.join(format!("step-{step:06}"));
                learner.save(self.model_dir, &dir, &self.state(step, learner.updates()))?;
            }
        }
        if show_progress {
            eprintln!();
        }
        summary.final_dir = opts.out.join("final");
        let state = self.state(summary.steps, learner.updates());
        learner.save(self.model_dir, &summary.final_dir, &state)?;
        Ok(summary)
    }

    /// One optimizer step; returns its metrics line.
    fn step<B: BackendGrad>(
        &self,
        learner: &mut Learner<'_, B>,
        objective: &Objective,
        step: u64,
        summary: &mut TrainSummary,
    ) -> Result<Value> {
        let opts = self.opts;
        let set = self.set;
        let batch = self.batch(step);
        let members: Vec<TrainSequence> = batch
            .iter()
            .map(|&k| {
                let (i, advantage) = set.kept[k];
                set.data.trajectories.train_sequence(i, advantage)
            })
            .collect();
        let olds: Vec<&[f32]> = match opts.algorithm {
            Algorithm::Rft => vec![&[]; members.len()],
            Algorithm::Dapo {
                old_logprobs: OldLogprobs::Rollout,
                ..
            } => members
                .iter()
                .map(|s| s.rollout_logprobs.as_slice())
                .collect(),
            Algorithm::Dapo {
                old_logprobs: OldLogprobs::Recompute,
                ..
            } => {
                let r = self.recomputed;
                batch
                    .iter()
                    .map(|&k| &r.rows[r.starts[k]..r.starts[k + 1]])
                    .collect()
            }
        };
        let lr = lr_at(
            opts.lr_schedule,
            opts.lr,
            opts.warmup_steps,
            self.total_steps,
            step,
        );
        let report = learner.step(&members.iter().collect::<Vec<_>>(), &olds, objective, lr)?;
        let mut metrics = json!({"step": step});
        for (k, v) in report.metrics.as_object().expect("an object") {
            metrics[k] = v.clone();
        }
        if report.skipped {
            summary.skipped_steps += 1;
            if self.writer {
                eprintln!(
                "step {step}: skipped (loss {}, gradient norm {}): NaN or Inf, or no action tokens",
                metrics["loss"], metrics["grad_norm"]
            );
            }
        } else {
            summary.first_loss.get_or_insert(report.loss);
            summary.last_loss = Some(report.loss);
        }
        Ok(metrics)
    }
}

/// The loss an algorithm trains with.
pub fn objective_of(algorithm: &Algorithm) -> Objective {
    match *algorithm {
        Algorithm::Rft => Objective::MaskedCe,
        Algorithm::Dapo {
            eps_low,
            eps_high,
            tis_cap,
            ..
        } => Objective::Dapo {
            eps_low,
            eps_high,
            tis_cap,
        },
    }
}

pub fn append_line(path: &std::path::Path, value: &Value) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    writeln!(file, "{value}").with_context(|| format!("cannot write {}", path.display()))
}

/// Keeps the metrics of steps up to `last_step`, in `metrics.jsonl` and in the event files (a
/// resumed run writes the rest again).
fn truncate_logs(out: &Path, last_step: u64) -> Result<()> {
    truncate_metrics(&out.join("metrics.jsonl"), last_step)?;
    tensorboard::trim(
        &out.join(tensorboard::DIR),
        &[(Series::Metrics, Some(last_step))],
    )
}

/// Keeps the metrics lines of steps up to `last_step` (a resumed run rewrites the rest).
fn truncate_metrics(path: &std::path::Path, last_step: u64) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|line| {
            serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s <= last_step)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(path, kept).with_context(|| format!("cannot rewrite {}", path.display()))
}
