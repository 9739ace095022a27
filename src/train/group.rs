//! A learner the RL loop can drive from one thread whatever its parallelism ([`Trainer`]): one
//! [`Learner`] on the caller's backend, or a [`LearnerGroup`] of tensor-parallel ranks on threads
//! of their own (a GPU each), which run every call together (SPMD) and answer with rank 0's
//! result.
//!
//! ```text
//!  RL loop ─ step(batch) ─► LearnerGroup ─┬─ rank 0: Learner::step ◄── collectives ──┐
//!                                         ├─ rank 1: Learner::step ◄─────────────────┤
//!                                         └─ ...                                      │
//!          ◄── rank 0's report ───────────┴──────────────────────────────────────────┘
//! ```
//!
//! Handing weights to the engine ([`crate::model::handoff`]): every rank gives its own shard,
//! never the whole model: its compute weights' device spans (the engine rank on the same GPU
//! copies them), or its tensors one at a time through host memory, rank after rank (a call to
//! that rank alone: nothing collective). A group may be one replica of a data-parallel group
//! spanning processes (a multi-node RL loop): its other calls then run on every process
//! together.

use crate::backend::{BackendGrad, DeviceChoice};
use crate::dist::grid::{GridSpec, RankPlace, RankTask};
use crate::dist::launch::ProcessGroupEnv;
use crate::dist::Groups;
use crate::model::handoff::{RankSpans, ShardSender};
use crate::model::Qwen2Params;
use crate::tensor::HostTensor;
use crate::train::data::TrainSequence;
use crate::train::learner::{Learner, StepReport};
use crate::train::loss::Objective;
use crate::train::optimizer::AdamWConfig;
use anyhow::{anyhow, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What the RL loop asks of a learner (see [`Learner`] for each call's meaning).
pub trait Trainer {
    fn logprobs(&self, sequences: &[&TrainSequence]) -> Result<Vec<Vec<f32>>>;
    fn step(
        &mut self,
        batch: &[&TrainSequence],
        old_logprobs: &[&[f32]],
        objective: &Objective,
        lr: f64,
    ) -> Result<StepReport>;
    fn save(&self, model_dir: &Path, dir: &Path, state: &Value) -> Result<()>;
    fn restore(&mut self, dir: &Path) -> Result<Value>;
    fn updates(&self) -> u64;
    /// Every tensor-parallel rank's compute weights on its GPU (rank order), for an engine
    /// whose rank r is on rank r's GPU to copy device to device; `None` on a host backend.
    fn compute_weight_spans(&self) -> Result<Option<Vec<RankSpans>>>;
    /// Sends every rank's compute weights into `out`: rank 0's shard one tensor at a time, then
    /// rank 1's, ... (see [`Learner::send_compute_weights`]).
    fn send_compute_weights(&self, out: &ShardSender) -> Result<()>;
    /// Gives memory back while the rollouts run, until the next step: the gradient buffers, and
    /// the optimizer state's device memory where the learner offloads it (see
    /// [`Learner::release_training_memory`]).
    fn release_training_memory(&mut self) -> Result<()>;
}

impl<B: BackendGrad> Trainer for Learner<'_, B> {
    fn logprobs(&self, sequences: &[&TrainSequence]) -> Result<Vec<Vec<f32>>> {
        Learner::logprobs(self, sequences)
    }
    fn step(
        &mut self,
        batch: &[&TrainSequence],
        old_logprobs: &[&[f32]],
        objective: &Objective,
        lr: f64,
    ) -> Result<StepReport> {
        Learner::step(self, batch, old_logprobs, objective, lr)
    }
    fn save(&self, model_dir: &Path, dir: &Path, state: &Value) -> Result<()> {
        Learner::save(self, model_dir, dir, state)
    }
    fn restore(&mut self, dir: &Path) -> Result<Value> {
        Learner::restore(self, dir)
    }
    fn updates(&self) -> u64 {
        Learner::updates(self)
    }
    fn compute_weight_spans(&self) -> Result<Option<Vec<RankSpans>>> {
        Ok(Learner::compute_weight_spans(self)?.map(|rank| vec![rank]))
    }
    fn send_compute_weights(&self, out: &ShardSender) -> Result<()> {
        Learner::send_compute_weights(self, out)
    }
    fn release_training_memory(&mut self) -> Result<()> {
        Learner::release_training_memory(self)
    }
}

/// A call every rank runs.
enum Call {
    Logprobs(Arc<Vec<TrainSequence>>),
    Step(Arc<Vec<TrainSequence>>, Arc<Vec<Vec<f32>>>, Objective, f64),
    Save(PathBuf, PathBuf, Value),
    Restore(PathBuf),
    /// Every rank's device spans.
    Spans,
    /// One rank's shard into the sender (a call to that rank alone).
    SendWeights(ShardSender),
    /// Every rank's whole-model gather (rank 0 answers with the model).
    Weights,
    ReleaseTrainingMemory,
}

/// Rank 0's answer to a call.
enum Answer {
    Logprobs(Vec<Vec<f32>>),
    Step(StepReport),
    Saved,
    Restored(Value, u64),
    Spans(Option<RankSpans>),
    Weights(Option<Qwen2Params<HostTensor<'static>>>),
}

struct Rank {
    calls: Option<Sender<Call>>,
    answers: Receiver<Result<Answer>>,
    thread: Option<JoinHandle<()>>,
}

/// Tensor-parallel ranks of one learner on threads of their own (see the module doc).
pub struct LearnerGroup {
    ranks: Vec<Rank>,
    updates: u64,
}

/// What each rank builds its learner from.
#[derive(Clone)]
pub struct LearnerSpec {
    pub model_dir: PathBuf,
    pub adamw: AdamWConfig,
    pub micro_batch_tokens: usize,
    pub checkpoint_layers: bool,
    /// See [`Learner::offload_optimizer`].
    pub offload_optimizer: bool,
}

/// A rank's end of its channels: calls in, answers out.
type Inbox = (Receiver<Call>, Sender<Result<Answer>>);

/// The rank task behind a group: builds the learner, then serves calls until the group drops.
struct Serve {
    spec: LearnerSpec,
    /// Each rank's channels, taken by the rank that owns them.
    inboxes: Mutex<Vec<Option<Inbox>>>,
}

impl RankTask for Serve {
    type Output = ();

    fn run<B: BackendGrad + 'static>(
        &self,
        backend: &B,
        groups: Groups<B>,
        place: RankPlace,
    ) -> Result<()> {
        let (calls, answers) = self.inboxes.lock().expect("inboxes")[place.local_index]
            .take()
            .ok_or_else(|| anyhow!("rank {} started twice", place.local_index))?;
        let spec = &self.spec;
        let built = Learner::new_in(
            backend,
            &spec.model_dir,
            spec.adamw,
            spec.micro_batch_tokens,
            spec.checkpoint_layers,
            &groups,
        );
        let mut learner = match built {
            Ok(mut learner) => {
                learner.offload_optimizer = spec.offload_optimizer;
                let _ = answers.send(Ok(Answer::Saved));
                learner
            }
            Err(e) => {
                let _ = answers.send(Err(e));
                return Ok(());
            }
        };
        while let Ok(call) = calls.recv() {
            let answer = serve_call(&mut learner, call);
            // A rank that failed leaves (its communicator with it), so ranks waiting for it in
            // a collective fail instead of waiting forever; the group is broken from then on.
            let failed = answer.is_err();
            if answers.send(answer).is_err() || failed {
                break;
            }
        }
        Ok(())
    }
}

fn serve_call<B: BackendGrad>(learner: &mut Learner<'_, B>, call: Call) -> Result<Answer> {
    Ok(match call {
        Call::Logprobs(sequences) => {
            let refs: Vec<&TrainSequence> = sequences.iter().collect();
            Answer::Logprobs(learner.logprobs(&refs)?)
        }
        Call::Step(batch, olds, objective, lr) => {
            let refs: Vec<&TrainSequence> = batch.iter().collect();
            let olds: Vec<&[f32]> = olds.iter().map(Vec::as_slice).collect();
            Answer::Step(learner.step(&refs, &olds, &objective, lr)?)
        }
        Call::Save(model_dir, dir, state) => {
            learner.save(&model_dir, &dir, &state)?;
            Answer::Saved
        }
        Call::Restore(dir) => {
            let state = learner.restore(&dir)?;
            Answer::Restored(state, learner.updates())
        }
        Call::Spans => Answer::Spans(learner.compute_weight_spans()?),
        Call::SendWeights(out) => {
            learner.send_compute_weights(&out)?;
            Answer::Saved
        }
        Call::Weights => Answer::Weights(learner.gather_compute_weights()?),
        Call::ReleaseTrainingMemory => {
            learner.release_training_memory()?;
            Answer::Saved
        }
    })
}

impl LearnerGroup {
    /// Starts `tensor_parallel` ranks on `device`'s backend kind (a thread each, a GPU each),
    /// each loading its part of `spec.model_dir`, as this process's replica of the data-parallel
    /// group of `process` (one replica per process); returns once every rank is built, or with
    /// the first rank's own error.
    pub fn start(
        device: DeviceChoice,
        tensor_parallel: usize,
        process: ProcessGroupEnv,
        spec: LearnerSpec,
    ) -> Result<Self> {
        let grid = GridSpec {
            tp: tensor_parallel,
            dp_local: 1,
            process,
        };
        let mut ranks = Vec::with_capacity(tensor_parallel);
        let mut inboxes = Vec::with_capacity(tensor_parallel);
        for _ in 0..tensor_parallel {
            let (call_tx, call_rx) = channel();
            let (answer_tx, answer_rx) = channel();
            inboxes.push(Some((call_rx, answer_tx)));
            ranks.push(Rank {
                calls: Some(call_tx),
                answers: answer_rx,
                thread: None,
            });
        }
        let serve = Serve {
            spec,
            inboxes: Mutex::new(inboxes),
        };
        let thread = std::thread::Builder::new()
            .name("swerve-learner-ranks".into())
            .spawn(move || {
                if let Err(e) = crate::dist::grid::run_grid(device, &grid, &serve) {
                    eprintln!("learner ranks: {e:#}");
                }
            })?;
        ranks[0].thread = Some(thread);
        let group = Self { ranks, updates: 0 };
        group.collect()?;
        Ok(group)
    }

    /// Sends `call()` to every rank and returns rank 0's answer (or the first rank's error).
    fn call(&self, call: impl Fn() -> Call) -> Result<Answer> {
        self.send_all(call)?;
        self.collect()
    }

    /// Sends `call()` to every rank and returns every rank's answer in rank order (or the first
    /// rank's error, as [`Self::call`]).
    fn call_all(&self, call: impl Fn() -> Call) -> Result<Vec<Answer>> {
        self.send_all(call)?;
        let mut answers = self.answers()?;
        if let Some(at) = first_cause(&answers) {
            // A rank's own error, not its echo of another's.
            answers.swap_remove(at)?;
        }
        answers.into_iter().collect()
    }

    /// Sends `call` to rank `r` alone and returns its answer (a call with no collective in it).
    fn call_one(&self, r: usize, call: Call) -> Result<Answer> {
        let rank = &self.ranks[r];
        let calls = rank
            .calls
            .as_ref()
            .ok_or_else(|| anyhow!("learner rank {r} is gone"))?;
        calls
            .send(call)
            .map_err(|_| anyhow!("learner rank {r} has stopped"))?;
        rank.answers
            .recv()
            .map_err(|_| anyhow!("learner rank {r} has stopped"))?
    }

    fn send_all(&self, call: impl Fn() -> Call) -> Result<()> {
        for (r, rank) in self.ranks.iter().enumerate() {
            let calls = rank
                .calls
                .as_ref()
                .ok_or_else(|| anyhow!("learner rank {r} is gone"))?;
            calls
                .send(call())
                .map_err(|_| anyhow!("learner rank {r} has stopped"))?;
        }
        Ok(())
    }

    /// Every rank's answer to the call in flight, in rank order.
    fn answers(&self) -> Result<Vec<Result<Answer>>> {
        let mut answers = Vec::with_capacity(self.ranks.len());
        for (r, rank) in self.ranks.iter().enumerate() {
            answers.push(
                rank.answers
                    .recv()
                    .map_err(|_| anyhow!("learner rank {r} has stopped"))?,
            );
        }
        Ok(answers)
    }

    /// Rank 0's answer to the call in flight, or the first rank's own error.
    fn collect(&self) -> Result<Answer> {
        let mut answers = self.answers()?;
        if let Some(at) = first_cause(&answers) {
            return answers.swap_remove(at);
        }
        answers.swap_remove(0)
    }
}

/// The first answer that is a rank's own error (not its echo of another rank leaving).
fn first_cause(answers: &[Result<Answer>]) -> Option<usize> {
    let is_echo = |e: &anyhow::Error| format!("{e:#}").contains("left the group");
    answers
        .iter()
        .position(|a| matches!(a, Err(e) if !is_echo(e)))
}

impl Drop for LearnerGroup {
    fn drop(&mut self) {
        for rank in &mut self.ranks {
            rank.calls.take();
        }
        for rank in &mut self.ranks {
            if let Some(thread) = rank.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

fn unexpected() -> anyhow::Error {
    anyhow!("a learner rank answered another call")
}

impl Trainer for LearnerGroup {
    fn logprobs(&self, sequences: &[&TrainSequence]) -> Result<Vec<Vec<f32>>> {
        let shared = Arc::new(sequences.iter().map(|s| (*s).clone()).collect::<Vec<_>>());
        match self.call(|| Call::Logprobs(shared.clone()))? {
            Answer::Logprobs(rows) => Ok(rows),
            _ => Err(unexpected()),
        }
    }
    fn step(
        &mut self,
        batch: &[&TrainSequence],
        old_logprobs: &[&[f32]],
        objective: &Objective,
        lr: f64,
    ) -> Result<StepReport> {
        let batch = Arc::new(batch.iter().map(|s| (*s).clone()).collect::<Vec<_>>());
        let olds = Arc::new(old_logprobs.iter().map(|o| o.to_vec()).collect::<Vec<_>>());
        match self.call(|| Call::Step(batch.clone(), olds.clone(), *objective, lr))? {
            Answer::Step(report) => {
                if !report.skipped {
                    self.updates += 1;
                }
                Ok(report)
            }
            _ => Err(unexpected()),
        }
    }
    fn save(&self, model_dir: &Path, dir: &Path, state: &Value) -> Result<()> {
        let call = || Call::Save(model_dir.to_path_buf(), dir.to_path_buf(), state.clone());
        match self.call(call)? {
            Answer::Saved => Ok(()),
            _ => Err(unexpected()),
        }
    }
    fn restore(&mut self, dir: &Path) -> Result<Value> {
        match self.call(|| Call::Restore(dir.to_path_buf()))? {
            Answer::Restored(state, updates) => {
                self.updates = updates;
                Ok(state)
            }
            _ => Err(unexpected()),
        }
    }
    fn updates(&self) -> u64 {
        self.updates
    }
    fn compute_weight_spans(&self) -> Result<Option<Vec<RankSpans>>> {
        let mut ranks = Vec::with_capacity(self.ranks.len());
        for answer in self.call_all(|| Call::Spans)? {
            match answer {
                Answer::Spans(Some(rank)) => ranks.push(rank),
                Answer::Spans(None) => return Ok(None),
                _ => return Err(unexpected()),
            }
        }
        Ok(Some(ranks))
    }
    /// Rank by rank: each rank streams its shard while the others wait, so the host holds one
    /// rank's tensor in flight at a time.
    fn send_compute_weights(&self, out: &ShardSender) -> Result<()> {
        for r in 0..self.ranks.len() {
            match self.call_one(r, Call::SendWeights(out.clone()))? {
                Answer::Saved => {}
                _ => return Err(unexpected()),
            }
        }
        Ok(())
    }
    fn release_training_memory(&mut self) -> Result<()> {
        match self.call(|| Call::ReleaseTrainingMemory)? {
            Answer::Saved => Ok(()),
            _ => Err(unexpected()),
        }
    }
}

impl LearnerGroup {
    /// The compute weights as whole f32 host tensors, gathered from every rank
    /// ([`Learner::gather_compute_weights`]): the whole model in one host's memory, for tools
    /// and tests (the RL loop hands over shards: [`Trainer::send_compute_weights`]).
    pub fn gather_compute_weights(&self) -> Result<Qwen2Params<HostTensor<'static>>> {
        match self.call(|| Call::Weights)? {
            Answer::Weights(Some(weights)) => Ok(weights),
            _ => Err(unexpected()),
        }
    }
}
