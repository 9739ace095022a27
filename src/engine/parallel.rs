//! Serving a tensor-parallel model: one [`Engine`] per rank, stepped in lockstep.
//!
//! ```text
//!  engine thread (rank 0)                          follower threads (ranks 1 .. tp-1)
//!  EngineThread ─ TpEngine::step ─┬─ Step ──────►  Engine::step   (their own shard, KV cache)
//!                                 │  Engine::step ◄── collectives inside the forward ──►
//!                                 └─ compare ◄────  sampled tokens
//! ```
//!
//! Every rank runs the same scheduler on the same requests in the same order, so the plans,
//! block tables and KV caches agree; each rank's forward computes its heads and MLP columns and
//! the ranks' collectives join them; the LM head's vocabulary shards are gathered so every rank
//! samples from the whole distribution with the same generator: the same token. Rank 0's events
//! go to the clients; the followers' sampled tokens are compared with rank 0's every step (a
//! divergence is an error, never a silent mix). Decode steps run eagerly (no CUDA graphs across
//! ranks yet).

use crate::backend::Backend;
use crate::engine::engine::{Engine, EngineEvent, EngineStats, FinalRecord};
use crate::engine::request::{GenerationRequest, RequestOptions};
use crate::engine::sleep::Released;
use crate::kvcache::RequestId;
use crate::model::handoff::{shard_channel, RankSpans, ShardTensor};
use crate::model::Qwen2Params;
use crate::tensor::HostTensor;
use anyhow::{anyhow, bail, ensure, Context, Result};
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What the engine thread drives ([`crate::engine::EngineHandle`]): one engine, or a
/// tensor-parallel group of them.
pub trait EngineCore {
    fn add_request_with(
        &mut self,
        request: GenerationRequest,
        options: RequestOptions,
    ) -> Result<RequestId>;
    fn abort(&mut self, id: RequestId) -> Option<FinalRecord>;
    fn has_unfinished(&self) -> bool;
    fn step(&mut self) -> Result<Vec<EngineEvent>>;
    fn update_weights(&mut self, dir: &std::path::Path) -> Result<u64>;
    /// Weights handed over in memory, whole tensors in checkpoint order (each rank takes its
    /// part).
    fn update_weights_from_host(
        &mut self,
        host: Arc<Qwen2Params<HostTensor<'static>>>,
    ) -> Result<u64>;
    /// Each rank's weights from the device memory of the trainer rank of the same index on the
    /// same GPU (`ranks`: one per rank, in rank order), every rank at once.
    ///
    /// # Safety
    /// As [`Engine::update_weights_from_device`], for every rank's spans.
    unsafe fn update_weights_from_device(&mut self, ranks: &[RankSpans]) -> Result<u64>;
    /// Each rank's weights from `stream`: rank 0's shard one tensor at a time, then rank 1's, ...
    /// (see [`crate::model::handoff`]); never more than a tensor or two on the host at once.
    fn update_weights_streamed(&mut self, stream: &Receiver<ShardTensor>) -> Result<u64>;
    fn release_kv_cache(&mut self) -> Result<usize>;
    fn restore_kv_cache(&mut self) -> Result<()>;
    /// See [`Engine::sleep`].
    fn sleep(&mut self, level: u8) -> Result<Released>;
    fn weights_released(&self) -> bool;
    fn restore_weights(&mut self, dir: &std::path::Path) -> Result<u64>;
    fn reset_prefix_cache(&mut self) -> usize;
    fn stats(&self) -> EngineStats;
}

impl<B: Backend> EngineCore for Engine<B> {
    fn add_request_with(
        &mut self,
        request: GenerationRequest,
        options: RequestOptions,
    ) -> Result<RequestId> {
        Engine::add_request_with(self, request, options)
    }
    fn abort(&mut self, id: RequestId) -> Option<FinalRecord> {
        Engine::abort(self, id)
    }
    fn has_unfinished(&self) -> bool {
        Engine::has_unfinished(self)
    }
    fn step(&mut self) -> Result<Vec<EngineEvent>> {
        Engine::step(self)
    }
    fn update_weights(&mut self, dir: &std::path::Path) -> Result<u64> {
        Engine::update_weights(self, dir)
    }
    fn update_weights_from_host(
        &mut self,
        host: Arc<Qwen2Params<HostTensor<'static>>>,
    ) -> Result<u64> {
        self.update_weights_from_whole(&host)
    }
    unsafe fn update_weights_from_device(&mut self, ranks: &[RankSpans]) -> Result<u64> {
        ensure!(
            ranks.len() == 1,
            "device spans of {} trainer ranks for a one-rank engine",
            ranks.len()
        );
        // SAFETY: forwarded from the caller.
        unsafe { self.update_weights_from_rank_spans(&ranks[0]) }
    }
    fn update_weights_streamed(&mut self, stream: &Receiver<ShardTensor>) -> Result<u64> {
        Engine::update_weights_streamed(self, stream)
    }
    fn release_kv_cache(&mut self) -> Result<usize> {
        Engine::release_kv_cache(self)
    }
    fn restore_kv_cache(&mut self) -> Result<()> {
        Engine::restore_kv_cache(self)
    }
    fn sleep(&mut self, level: u8) -> Result<Released> {
        Engine::sleep(self, level)
    }
    fn weights_released(&self) -> bool {
        Engine::weights_released(self)
    }
    fn restore_weights(&mut self, dir: &std::path::Path) -> Result<u64> {
        Engine::restore_weights(self, dir)
    }
    fn reset_prefix_cache(&mut self) -> usize {
        Engine::reset_prefix_cache(self)
    }
    fn stats(&self) -> EngineStats {
        Engine::stats(self)
    }
}

/// What rank 0 asks a follower to do, in the order it does it itself.
enum RankOp {
    Add(GenerationRequest, RequestOptions),
    Abort(RequestId),
    Step,
    Reload(PathBuf),
    ReloadFrom(Arc<Qwen2Params<HostTensor<'static>>>),
    /// This rank's spans of a device-to-device handoff.
    CopyFromDevice(RankSpans),
    /// This rank's shard of a streamed handoff, relayed by rank 0.
    OverwriteFromStream(Receiver<ShardTensor>),
    /// The end of a streamed handoff.
    FinishStreamedUpdate,
    ReleaseKv,
    RestoreKv,
    Sleep(u8),
    RestoreWeights(PathBuf),
    ResetPrefixCache,
}

/// A follower's answer, compared with rank 0's.
#[derive(Debug, PartialEq)]
enum RankDone {
    Added(RequestId),
    Aborted(bool),
    /// Every token sampled in the step, in event order.
    Stepped(Vec<(RequestId, u32)>),
    Version(u64),
    Overwritten,
    Released(usize),
    Restored,
    Slept(Released),
    Reset(usize),
}

struct Follower {
    rank: usize,
    ops: Option<Sender<RankOp>>,
    done: Receiver<Result<RankDone>>,
    thread: Option<JoinHandle<()>>,
}

/// Rank 0's engine and the followers running the other ranks' (see the module doc).
pub struct TpEngine<B: Backend> {
    leader: Engine<B>,
    followers: Vec<Follower>,
}

impl<B: Backend> TpEngine<B> {
    /// Builds rank 0's engine here and ranks `1..tp`'s on threads of their own (each backend is
    /// made on the thread that uses it): `make(rank)` builds rank `rank`'s engine. Fails with
    /// the first rank's own error if any fails to build.
    pub fn start(
        tp: usize,
        make: impl Fn(usize) -> Result<Engine<B>> + Send + Sync + Clone + 'static,
    ) -> Result<Self>
    where
        B: 'static,
    {
        let mut followers = Vec::with_capacity(tp.saturating_sub(1));
        let mut built = Vec::with_capacity(tp.saturating_sub(1));
        for rank in 1..tp {
            let (ops_tx, ops_rx) = channel::<RankOp>();
            let (done_tx, done_rx) = channel::<Result<RankDone>>();
            let (ready_tx, ready_rx) = channel::<Result<()>>();
            let make = make.clone();
            let thread = std::thread::Builder::new()
                .name(format!("swerve-engine-rank-{rank}"))
                .spawn(move || match make(rank) {
                    Ok(engine) => {
                        let _ = ready_tx.send(Ok(()));
                        follow(engine, ops_rx, done_tx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                })?;
            built.push(ready_rx);
            followers.push(Follower {
                rank,
                ops: Some(ops_tx),
                done: done_rx,
                thread: Some(thread),
            });
        }
        let leader = make(0);
        let mut errors: Vec<anyhow::Error> = Vec::new();
        for (rank, ready) in built.into_iter().enumerate() {
            match ready.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e.context(format!("tensor-parallel rank {}", rank + 1))),
                Err(_) => errors.push(anyhow!(
                    "tensor-parallel rank {} died while starting",
                    rank + 1
                )),
            }
        }
        let leader = match leader {
            Ok(leader) if errors.is_empty() => leader,
            Ok(_) => return Err(first_cause(errors)),
            Err(e) => {
                errors.insert(0, e);
                return Err(first_cause(errors));
            }
        };
        Ok(Self { leader, followers })
    }

    /// Sends `op(rank)` to every follower (they start at once), runs `mine` here, then checks
    /// each follower's answer against `expected(mine's result)` (`None`: any success will do).
    /// Returns rank 0's result and the followers' answers.
    fn lockstep<R>(
        &mut self,
        op: impl Fn(usize) -> RankOp,
        mine: impl FnOnce(&mut Engine<B>) -> Result<R>,
        expected: impl Fn(&R) -> Option<RankDone>,
    ) -> Result<(R, Vec<RankDone>)> {
        for f in &self.followers {
            if let Some(ops) = &f.ops {
                ops.send(op(f.rank))
                    .map_err(|_| anyhow!("tensor-parallel rank {} has stopped", f.rank))?;
            }
        }
        let result = mine(&mut self.leader);
        let mut disagreement = None;
        let mut answers = Vec::with_capacity(self.followers.len());
        for f in &self.followers {
            let answer = f
                .done
                .recv()
                .map_err(|_| anyhow!("tensor-parallel rank {} has stopped", f.rank))?;
            if disagreement.is_some() {
                continue;
            }
            disagreement = match (&result, answer) {
                (Ok(r), Ok(theirs)) => match expected(r) {
                    Some(want) if want != theirs => Some(anyhow!(
                        "tensor-parallel rank {} diverged from rank 0: {theirs:?} where rank 0 has {want:?}",
                        f.rank
                    )),
                    _ => {
                        answers.push(theirs);
                        None
                    }
                },
                (Ok(_), Err(e)) => Some(e.context(format!("tensor-parallel rank {}", f.rank))),
                (Err(_), _) => None,
            };
        }
        match disagreement {
            Some(e) => Err(e),
            None => result.map(|r| (r, answers)),
        }
    }

    /// Rank 0 takes its own shard from `stream`, then relays each follower's, rank by rank,
    /// through a rendezvous channel of its own: one tensor in flight at a time.
    fn overwrite_every_shard(&mut self, stream: &Receiver<ShardTensor>) -> Result<()> {
        self.leader.overwrite_from_stream(stream)?;
        let tensors = self.leader.model.params.iter().count();
        for f in &self.followers {
            let ops = f
                .ops
                .as_ref()
                .ok_or_else(|| anyhow!("tensor-parallel rank {} has stopped", f.rank))?;
            let (relay, shard) = shard_channel();
            ops.send(RankOp::OverwriteFromStream(shard))
                .map_err(|_| anyhow!("tensor-parallel rank {} has stopped", f.rank))?;
            for _ in 0..tensors {
                // A short stream, or a rank that stopped taking: its answer says which.
                let Ok(tensor) = stream.recv() else { break };
                if relay.send(tensor).is_err() {
                    break;
                }
            }
            drop(relay);
            match f.done.recv() {
                Ok(Ok(RankDone::Overwritten)) => {}
                Ok(Ok(other)) => bail!("tensor-parallel rank {} answered {other:?}", f.rank),
                Ok(Err(e)) => return Err(e.context(format!("tensor-parallel rank {}", f.rank))),
                Err(_) => bail!("tensor-parallel rank {} has stopped", f.rank),
            }
        }
        Ok(())
    }
}

/// A follower's loop: each op on its engine, the answer back, until rank 0 hangs up.
fn follow<B: Backend>(
    mut engine: Engine<B>,
    ops: Receiver<RankOp>,
    done: Sender<Result<RankDone>>,
) {
    while let Ok(op) = ops.recv() {
        let answer = match op {
            RankOp::Add(request, options) => engine
                .add_request_with(request, options)
                .map(RankDone::Added),
            RankOp::Abort(id) => Ok(RankDone::Aborted(engine.abort(id).is_some())),
            RankOp::Step => engine
                .step()
                .map(|events| RankDone::Stepped(sampled(&events))),
            RankOp::Reload(dir) => engine.update_weights(&dir).map(RankDone::Version),
            RankOp::ReloadFrom(host) => engine
                .update_weights_from_whole(&host)
                .map(RankDone::Version),
            // SAFETY: rank 0 waits for this answer before `update_weights_from_device` returns,
            // and its caller keeps the spans live and unwritten until then.
            RankOp::CopyFromDevice(spans) => {
                unsafe { engine.update_weights_from_rank_spans(&spans) }.map(RankDone::Version)
            }
            RankOp::OverwriteFromStream(stream) => engine
                .overwrite_from_stream(&stream)
                .map(|()| RankDone::Overwritten),
            RankOp::FinishStreamedUpdate => Ok(RankDone::Version(engine.finish_streamed_update())),
            RankOp::ReleaseKv => engine.release_kv_cache().map(RankDone::Released),
            RankOp::RestoreKv => engine.restore_kv_cache().map(|()| RankDone::Restored),
            RankOp::Sleep(level) => engine.sleep(level).map(RankDone::Slept),
            RankOp::RestoreWeights(dir) => engine.restore_weights(&dir).map(RankDone::Version),
            RankOp::ResetPrefixCache => Ok(RankDone::Reset(engine.reset_prefix_cache())),
        };
        if done.send(answer).is_err() {
            return;
        }
    }
}

/// The tokens a step sampled, in event order.
fn sampled(events: &[EngineEvent]) -> Vec<(RequestId, u32)> {
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Token(t) => Some((t.id, t.token)),
            _ => None,
        })
        .collect()
}

fn first_cause(mut errors: Vec<anyhow::Error>) -> anyhow::Error {
    let is_echo = |e: &anyhow::Error| format!("{e:#}").contains("left the group");
    let at = errors.iter().position(|e| !is_echo(e)).unwrap_or(0);
    errors.swap_remove(at)
}

impl<B: Backend> Drop for TpEngine<B> {
    fn drop(&mut self) {
        for f in &mut self.followers {
            f.ops.take();
        }
        for f in &mut self.followers {
            if let Some(thread) = f.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl<B: Backend> EngineCore for TpEngine<B> {
    fn add_request_with(
        &mut self,
        request: GenerationRequest,
        options: RequestOptions,
    ) -> Result<RequestId> {
        let op = |_| RankOp::Add(request.clone(), options.clone());
        let added = |&id: &RequestId| Some(RankDone::Added(id));
        let mine = |e: &mut Engine<B>| e.add_request_with(request.clone(), options.clone());
        Ok(self.lockstep(op, mine, added)?.0)
    }
    fn abort(&mut self, id: RequestId) -> Option<FinalRecord> {
        let aborted = |r: &Option<FinalRecord>| Some(RankDone::Aborted(r.is_some()));
        let result = self.lockstep(|_| RankOp::Abort(id), |e| Ok(e.abort(id)), aborted);
        result.ok().and_then(|(record, _)| record)
    }
    fn has_unfinished(&self) -> bool {
        self.leader.has_unfinished()
    }
    fn step(&mut self) -> Result<Vec<EngineEvent>> {
        let same_tokens = |events: &Vec<EngineEvent>| Some(RankDone::Stepped(sampled(events)));
        Ok(self
            .lockstep(|_| RankOp::Step, |e| e.step(), same_tokens)?
            .0)
    }
    fn update_weights(&mut self, dir: &std::path::Path) -> Result<u64> {
        let op = |_| RankOp::Reload(dir.to_path_buf());
        let version = |&v: &u64| Some(RankDone::Version(v));
        Ok(self.lockstep(op, |e| e.update_weights(dir), version)?.0)
    }
    fn update_weights_from_host(
        &mut self,
        host: Arc<Qwen2Params<HostTensor<'static>>>,
    ) -> Result<u64> {
        let op = |_| RankOp::ReloadFrom(host.clone());
        let version = |&v: &u64| Some(RankDone::Version(v));
        Ok(self
            .lockstep(op, |e| e.update_weights_from_whole(&host), version)?
            .0)
    }
    unsafe fn update_weights_from_device(&mut self, ranks: &[RankSpans]) -> Result<u64> {
        let tp = self.followers.len() + 1;
        ensure!(
            ranks.len() == tp,
            "device spans of {} trainer ranks for a {tp}-rank engine",
            ranks.len()
        );
        let op = |rank: usize| RankOp::CopyFromDevice(ranks[rank].clone());
        // SAFETY: forwarded from the caller; `lockstep` waits for every rank's copy.
        let mine = |e: &mut Engine<B>| unsafe { e.update_weights_from_rank_spans(&ranks[0]) };
        let version = |&v: &u64| Some(RankDone::Version(v));
        Ok(self.lockstep(op, mine, version)?.0)
    }
    fn update_weights_streamed(&mut self, stream: &Receiver<ShardTensor>) -> Result<u64> {
        self.overwrite_every_shard(stream)
            .context("the weights may now be partly overwritten: hand them over again")?;
        let finish = |e: &mut Engine<B>| Ok(e.finish_streamed_update());
        let version = |&v: &u64| Some(RankDone::Version(v));
        Ok(self
            .lockstep(|_| RankOp::FinishStreamedUpdate, finish, version)?
            .0)
    }
    /// The K and V elements freed on every rank together.
    fn release_kv_cache(&mut self) -> Result<usize> {
        let (mine, theirs) =
            self.lockstep(|_| RankOp::ReleaseKv, |e| e.release_kv_cache(), |_| None)?;
        Ok(mine
            + theirs
                .iter()
                .map(|d| match d {
                    RankDone::Released(n) => *n,
                    _ => 0,
                })
                .sum::<usize>())
    }
    fn restore_kv_cache(&mut self) -> Result<()> {
        let restored = |_: &()| Some(RankDone::Restored);
        self.lockstep(|_| RankOp::RestoreKv, |e| e.restore_kv_cache(), restored)?;
        Ok(())
    }
    /// The bytes released on every rank together.
    fn sleep(&mut self, level: u8) -> Result<Released> {
        let (mut total, theirs) =
            self.lockstep(|_| RankOp::Sleep(level), |e| e.sleep(level), |_| None)?;
        for done in theirs {
            if let RankDone::Slept(r) = done {
                total.kv_cache_bytes += r.kv_cache_bytes;
                total.weight_bytes += r.weight_bytes;
            }
        }
        Ok(total)
    }
    fn weights_released(&self) -> bool {
        self.leader.weights_released()
    }
    fn restore_weights(&mut self, dir: &std::path::Path) -> Result<u64> {
        let op = |_| RankOp::RestoreWeights(dir.to_path_buf());
        let version = |&v: &u64| Some(RankDone::Version(v));
        Ok(self.lockstep(op, |e| e.restore_weights(dir), version)?.0)
    }
    fn reset_prefix_cache(&mut self) -> usize {
        let reset = |&n: &usize| Some(RankDone::Reset(n));
        let done = self.lockstep(
            |_| RankOp::ResetPrefixCache,
            |e| Ok(e.reset_prefix_cache()),
            reset,
        );
        done.map_or(0, |(n, _)| n)
    }
    fn stats(&self) -> EngineStats {
        self.leader.stats()
    }
}
