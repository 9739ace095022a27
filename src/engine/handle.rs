//! [`EngineHandle`]: the engine on its own thread, driven through channels.
//!
//! ```text
//!  callers ──Command──► engine thread: drain commands ─► step ─► route events
//!     ▲                                                          │
//!     └──────────── per-request channel: Token ... Finished ◄────┘
//! ```
//!
//! Commands are handled between steps, so an abort or a weight update never lands inside one.
//! A request whose receiver is dropped (its client went away) is aborted at the next event and
//! its blocks return to the pool. [`EngineHandle::submit_with`] takes any [`EventSink`] (the
//! server's is an async channel) and answers through a callback, so an async caller never blocks
//! on the engine.
//!
//! Pausing: from the moment the thread takes a pause command, new submissions are held outside
//! the engine (they start on [`EngineHandle::resume`]), so what is in the engine is exactly what
//! was in flight at the pause. [`EngineHandle::pause`] also stops stepping (those requests keep
//! their state and blocks); [`EngineHandle::pause_after_in_flight`] lets them run to their end
//! and returns then. Commands are served either way.
//!
//! ```text
//!             submissions          in the engine        steps
//!  running    added at once        run                  yes
//!  pause      held until resume    frozen               no
//!  pause_after_in_flight
//!             held until resume    run to their end     until none is left
//! ```
//!
//! Sleeping is one command: the thread releases the memory and refuses every later submission
//! ([`EngineAsleep`]), and the held ones, before it serves the next command, so no submission
//! can allocate the KV cache again in between.

use crate::engine::engine::{EngineEvent, EngineStats, FinalRecord, TokenEvent};
use crate::engine::parallel::EngineCore;
use crate::engine::prompt_logprobs::PromptLogprobs;
use crate::engine::request::{GenerationRequest, RequestOptions};
use crate::engine::sleep::Released;
use crate::kvcache::RequestId;
use crate::model::handoff::{shard_channel, RankSpans, ShardSender, ShardTensor};
use crate::model::Qwen2Params;
use crate::tensor::HostTensor;
use anyhow::{anyhow, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What a request's receiver gets: its prompt logprobs when asked for (once, before any
/// token), its tokens as they come, then exactly one `Finished`.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestEvent {
    PromptLogprobs(PromptLogprobs),
    Token(TokenEvent),
    Finished(FinalRecord),
}

/// Where a request's events go. Returns false once nobody listens (the request is then aborted).
pub type EventSink = Box<dyn FnMut(RequestEvent) -> bool + Send>;

/// Receives the outcome of a submission: the request's id, or why it was refused.
pub type SubmitReply = Box<dyn FnOnce(Result<RequestId>) + Send>;

/// The refusal of a submission while the engine is asleep ([`EngineHandle::sleep`]), as the
/// error's source: callers tell it from a refusal of the request's fields with
/// `error.downcast_ref::<EngineAsleep>()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineAsleep {
    /// 1: the KV cache is released; 2: the weights too.
    pub level: u8,
}

impl std::fmt::Display for EngineAsleep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the engine is asleep (sleep level {}: its memory is released): wake it up first",
            self.level
        )
    }
}

impl std::error::Error for EngineAsleep {}

/// What [`EngineHandle::wake_up`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Woken {
    /// The weights were loaded from the folder given (they had been released).
    pub weights_loaded: bool,
    pub kv_cache_restored: bool,
    pub weight_version: u64,
}

/// A request as submitted: added to the engine at once, or held while paused.
struct Submission {
    request: GenerationRequest,
    options: RequestOptions,
    events: EventSink,
    reply: SubmitReply,
}

enum Command {
    Submit(Submission),
    Sleep(u8, Sender<Result<Released>>),
    WakeUp(WakeUp, Sender<Result<Woken>>),
    ResetPrefixCache(Sender<usize>),
    Abort(RequestId),
    AbortAll,
    UpdateWeights(PathBuf, Sender<Result<u64>>),
    UpdateWeightsFrom(Arc<Qwen2Params<HostTensor<'static>>>, Sender<Result<u64>>),
    UpdateWeightsFromDevice(Vec<RankSpans>, Sender<Result<u64>>),
    UpdateWeightsStreamed(Receiver<ShardTensor>, Sender<Result<u64>>),
    ReleaseKv(Sender<Result<usize>>),
    RestoreKv(Sender<Result<()>>),
    Stats(Sender<EngineStats>),
    Pause,
    PauseAfterInFlight(Sender<Result<()>>),
    Resume,
    Shutdown,
}

pub struct EngineHandle {
    commands: Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Starts the engine thread; `make` builds the engine there (so the backend never crosses
    /// threads). Returns once the engine is built, or with its construction error.
    pub fn spawn<E, F>(make: F) -> Result<Self>
    where
        E: EngineCore + 'static,
        F: FnOnce() -> Result<E> + Send + 'static,
    {
        let (commands, inbox) = channel::<Command>();
        let (ready_tx, ready_rx) = channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name("swerve-engine".into())
            .spawn(move || match make() {
                Ok(engine) => {
                    let _ = ready_tx.send(Ok(()));
                    run(engine, inbox);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| anyhow!("the engine thread died while starting"))??;
        Ok(Self {
            commands,
            thread: Some(thread),
        })
    }

    fn send(&self, command: Command) -> Result<()> {
        self.commands
            .send(command)
            .map_err(|_| anyhow!("the engine has stopped"))
    }

    /// Queues a request: its id and the receiver of its events. Invalid requests are refused here
    /// with an error naming the field.
    pub fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<(RequestId, Receiver<RequestEvent>)> {
        let (events_tx, events_rx) = channel();
        let (reply_tx, reply_rx) = channel();
        self.submit_with(
            request,
            Box::new(move |event| events_tx.send(event).is_ok()),
            Box::new(move |result| {
                let _ = reply_tx.send(result);
            }),
        )?;
        let id = reply_rx
            .recv()
            .map_err(|_| anyhow!("the engine has stopped"))??;
        Ok((id, events_rx))
    }

    /// Queues a request without waiting: `reply` gets its id (or the validation error, naming
    /// the field) between steps, and `sink` its events. Errors only if the engine has stopped.
    pub fn submit_with(
        &self,
        request: GenerationRequest,
        sink: EventSink,
        reply: SubmitReply,
    ) -> Result<()> {
        self.submit_with_options(request, RequestOptions::default(), sink, reply)
    }

    /// [`EngineHandle::submit_with`] with `min_tokens`, a priority or a cache salt.
    pub fn submit_with_options(
        &self,
        request: GenerationRequest,
        options: RequestOptions,
        sink: EventSink,
        reply: SubmitReply,
    ) -> Result<()> {
        self.send(Command::Submit(Submission {
            request,
            options,
            events: sink,
            reply,
        }))
    }

    /// Puts the engine to sleep between steps (see [`crate::engine::sleep`]): level 1 frees the
    /// KV cache, level 2 the weights too; refused with requests in the engine (running, waiting
    /// or frozen). The submissions held by a pause, and every one the thread takes after this
    /// command, are refused with [`EngineAsleep`] until [`EngineHandle::wake_up`]. Returns the
    /// bytes freed.
    pub fn sleep(&self, level: u8) -> Result<Released> {
        let (tx, rx) = channel();
        self.send(Command::Sleep(level, tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    /// Wakes the engine: loads released weights from `weights_dir` (when `weights`), allocates
    /// the KV cache again (when `kv_cache`); submissions are accepted again once both are back.
    pub fn wake_up(&self, weights_dir: PathBuf, weights: bool, kv_cache: bool) -> Result<Woken> {
        let (tx, rx) = channel();
        let wake = WakeUp {
            weights_dir,
            weights,
            kv_cache,
        };
        self.send(Command::WakeUp(wake, tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    /// Forgets every cached prefix between steps; returns the entries dropped.
    pub fn reset_prefix_cache(&self) -> Result<usize> {
        let (tx, rx) = channel();
        self.send(Command::ResetPrefixCache(tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))
    }

    /// Stops stepping after the current step: running and waiting requests keep their state and
    /// blocks, new submissions are held until [`EngineHandle::resume`], and every command is
    /// still served. Idempotent.
    pub fn pause(&self) -> Result<()> {
        self.send(Command::Pause)
    }

    /// Pauses once the requests in flight have finished: from the moment the thread takes this
    /// command new submissions are held until [`EngineHandle::resume`], while the requests
    /// already in the engine (frozen ones too) run to their end; returns then. An error if a
    /// resume came first.
    pub fn pause_after_in_flight(&self) -> Result<()> {
        let (tx, rx) = channel();
        self.send(Command::PauseAfterInFlight(tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    /// Steps again after a pause and starts the held submissions, in the order they came.
    /// Idempotent.
    pub fn resume(&self) -> Result<()> {
        self.send(Command::Resume)
    }

    /// Ends a request; its receiver gets `Finished` with reason `abort`.
    pub fn abort(&self, id: RequestId) -> Result<()> {
        self.send(Command::Abort(id))
    }

    /// Ends every request in the engine and every held submission (the held ones enter the
    /// engine only to be aborted): each receiver gets `Finished` with reason `abort`.
    pub fn abort_all(&self) -> Result<()> {
        self.send(Command::AbortAll)
    }

    /// Swaps weights between steps; returns the new weight version.
    pub fn update_weights(&self, dir: PathBuf) -> Result<u64> {
        let (tx, rx) = channel();
        self.send(Command::UpdateWeights(dir, tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    /// Swaps in weights handed over in memory, between steps; returns the new weight version.
    /// (Whole tensors in checkpoint order: a tensor-parallel engine's ranks each take their
    /// part.)
    pub fn update_weights_from(&self, host: Qwen2Params<HostTensor<'static>>) -> Result<u64> {
        let (tx, rx) = channel();
        self.send(Command::UpdateWeightsFrom(Arc::new(host), tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    /// Overwrites the engine's weights from another backend's device memory on the same
    /// devices, between steps: each engine rank copies the spans of the trainer rank of the same
    /// index (`ranks`, in rank order), device to device (see
    /// [`crate::engine::Engine::update_weights_from_device`]); returns the new version.
    ///
    /// # Safety
    /// The spans' memory must stay live and unwritten until this returns.
    pub unsafe fn update_weights_from_device(&self, ranks: Vec<RankSpans>) -> Result<u64> {
        let (tx, rx) = channel();
        self.send(Command::UpdateWeightsFromDevice(ranks, tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    /// Overwrites the engine's weights, between steps, with the tensors `send` writes (on this
    /// thread) into the sender it is given: every rank's shard in rank order, each in
    /// checkpoint order ([`crate::model::handoff`]). The engine writes each tensor in place as
    /// it takes it, so the host never holds more than a tensor or two of the model. Returns the
    /// new version; where both fail, the engine's error (the cause) comes first.
    pub fn update_weights_streamed(
        &self,
        send: impl FnOnce(&ShardSender) -> Result<()>,
    ) -> Result<u64> {
        let (tensors, stream) = shard_channel();
        let (tx, rx) = channel();
        self.send(Command::UpdateWeightsStreamed(stream, tx))?;
        let sent = send(&tensors);
        drop(tensors);
        let updated = rx.recv().map_err(|_| anyhow!("the engine has stopped"))?;
        let version = updated?;
        sent?;
        Ok(version)
    }

    /// Frees the KV cache's memory between steps (refused with requests in flight); the next
    /// request allocates it again. Returns the K and V elements freed.
    pub fn release_kv_cache(&self) -> Result<usize> {
        let (tx, rx) = channel();
        self.send(Command::ReleaseKv(tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    /// Allocates the KV cache again after [`EngineHandle::release_kv_cache`].
    pub fn restore_kv_cache(&self) -> Result<()> {
        let (tx, rx) = channel();
        self.send(Command::RestoreKv(tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    pub fn stats(&self) -> Result<EngineStats> {
        let (tx, rx) = channel();
        self.send(Command::Stats(tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))
    }

    /// Aborts everything in flight and stops the thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What to bring back on a wake-up.
struct WakeUp {
    weights_dir: PathBuf,
    weights: bool,
    kv_cache: bool,
}

/// The engine thread's state beside the engine.
struct Thread {
    listeners: HashMap<RequestId, EventSink>,
    /// No steps ([`EngineHandle::pause`]): the requests in the engine keep their state.
    frozen: bool,
    /// Paused: new submissions wait in `held`, outside the engine, until a resume.
    holding: bool,
    held: Vec<Submission>,
    /// [`EngineHandle::pause_after_in_flight`] callers, answered once the engine has nothing
    /// unfinished.
    pausing_after_in_flight: Vec<Sender<Result<()>>>,
    /// Put to sleep and not fully woken: submissions are refused.
    asleep: bool,
}

fn run<E: EngineCore>(mut engine: E, inbox: Receiver<Command>) {
    let mut thread = Thread {
        listeners: HashMap::new(),
        frozen: false,
        holding: false,
        held: Vec::new(),
        pausing_after_in_flight: Vec::new(),
        asleep: false,
    };
    loop {
        thread.finish_pause_after_in_flight(&engine);
        // Block for work when idle or frozen; otherwise take what has arrived and step.
        let mut commands = Vec::new();
        if !engine.has_unfinished() || thread.frozen {
            match inbox.recv() {
                Ok(c) => commands.push(c),
                Err(_) => return,
            }
        }
        commands.extend(inbox.try_iter());
        for command in commands {
            if thread.handle(&mut engine, command) {
                return;
            }
        }
        if !engine.has_unfinished() || thread.frozen {
            continue;
        }
        match engine.step() {
            Ok(events) => thread.route(&mut engine, events),
            Err(e) => {
                // A failed step (out of device memory, a kernel error) ends every request in
                // flight with the error rather than retrying forever.
                let reason = format!("{e:#}");
                for (id, mut tx) in thread.listeners.drain() {
                    if let Some(mut record) = engine.abort(id) {
                        record.finish_reason = crate::engine::FinishReason::Error(reason.clone());
                        tx(RequestEvent::Finished(record));
                    }
                }
            }
        }
    }
}

impl Thread {
    /// Serves one command between steps; true when the thread must stop.
    fn handle<E: EngineCore>(&mut self, engine: &mut E, command: Command) -> bool {
        match command {
            Command::Submit(submission) => {
                // Refused while asleep, never held: a wake-up may be a training step away.
                if self.holding && !self.asleep {
                    self.held.push(submission);
                } else {
                    self.add(engine, submission);
                }
            }
            Command::Abort(id) => self.abort(engine, id),
            Command::AbortAll => self.abort_all(engine),
            Command::Pause => {
                self.frozen = true;
                self.holding = true;
            }
            Command::PauseAfterInFlight(reply) => {
                // Requests frozen by an earlier pause could never finish: they run too.
                self.frozen = false;
                self.holding = true;
                self.pausing_after_in_flight.push(reply);
            }
            Command::Resume => self.resume(engine),
            Command::UpdateWeights(dir, reply) => {
                let _ = reply.send(engine.update_weights(&dir));
            }
            Command::UpdateWeightsFrom(host, reply) => {
                let _ = reply.send(engine.update_weights_from_host(host));
            }
            Command::UpdateWeightsFromDevice(ranks, reply) => {
                // SAFETY: the caller of `update_weights_from_device` keeps the spans live
                // and unwritten until it has the reply.
                let _ = reply.send(unsafe { engine.update_weights_from_device(&ranks) });
            }
            Command::UpdateWeightsStreamed(stream, reply) => {
                let result = engine.update_weights_streamed(&stream);
                // Hang up first: a sender still sending learns that nobody takes more.
                drop(stream);
                let _ = reply.send(result);
            }
            Command::ReleaseKv(reply) => {
                let _ = reply.send(engine.release_kv_cache());
            }
            Command::RestoreKv(reply) => {
                let _ = reply.send(engine.restore_kv_cache());
            }
            Command::Sleep(level, reply) => {
                let _ = reply.send(self.sleep(engine, level));
            }
            Command::WakeUp(wake, reply) => {
                let _ = reply.send(self.wake_up(engine, wake));
            }
            Command::ResetPrefixCache(reply) => {
                let _ = reply.send(engine.reset_prefix_cache());
            }
            Command::Stats(reply) => {
                let mut stats = engine.stats();
                stats.held = self.held.len();
                let _ = reply.send(stats);
            }
            Command::Shutdown => {
                for (id, mut tx) in self.listeners.drain() {
                    if let Some(record) = engine.abort(id) {
                        tx(RequestEvent::Finished(record));
                    }
                }
                // Dropped unanswered: their callers hear that the engine has stopped.
                self.held.clear();
                return true;
            }
        }
        false
    }

    /// Ends every request in the engine and every held submission (the held ones enter the
    /// engine only to be aborted, so each receiver hears `abort`).
    fn abort_all<E: EngineCore>(&mut self, engine: &mut E) {
        for submission in std::mem::take(&mut self.held) {
            if let Some(id) = self.add(engine, submission) {
                self.abort(engine, id);
            }
        }
        let ids: Vec<RequestId> = self.listeners.keys().copied().collect();
        for id in ids {
            self.abort(engine, id);
        }
    }

    /// Unfreezes, stops holding, and admits what was held; a pause still waiting for the
    /// requests in flight is answered with an error.
    fn resume<E: EngineCore>(&mut self, engine: &mut E) {
        self.frozen = false;
        self.holding = false;
        for reply in self.pausing_after_in_flight.drain(..) {
            let _ = reply.send(Err(anyhow!(
                "resumed before the requests in flight had finished"
            )));
        }
        for submission in std::mem::take(&mut self.held) {
            self.add(engine, submission);
        }
    }

    /// Releases memory and marks the thread asleep in this one command: the next submission it
    /// takes is refused, never allocates the KV cache again. Submissions held by a pause never
    /// started: refused now as any submission.
    fn sleep<E: EngineCore>(&mut self, engine: &mut E, level: u8) -> Result<Released> {
        let released = engine.sleep(level)?;
        self.asleep = true;
        for submission in std::mem::take(&mut self.held) {
            self.add(engine, submission);
        }
        Ok(released)
    }

    /// Adds a submission to the engine (refused while asleep, or for its fields); its id.
    fn add<E: EngineCore>(&mut self, engine: &mut E, submission: Submission) -> Option<RequestId> {
        let Submission {
            request,
            options,
            events,
            reply,
        } = submission;
        if self.asleep {
            let level = if engine.weights_released() { 2 } else { 1 };
            reply(Err(anyhow::Error::new(EngineAsleep { level })));
            return None;
        }
        match engine.add_request_with(request, options) {
            Ok(id) => {
                self.listeners.insert(id, events);
                reply(Ok(id));
                Some(id)
            }
            Err(e) => {
                reply(Err(e));
                None
            }
        }
    }

    /// Ends a request; its listener gets `Finished` with reason `abort`.
    fn abort<E: EngineCore>(&mut self, engine: &mut E, id: RequestId) {
        if let Some(record) = engine.abort(id) {
            if let Some(mut tx) = self.listeners.remove(&id) {
                tx(RequestEvent::Finished(record));
            }
        }
    }

    /// Answers the [`EngineHandle::pause_after_in_flight`] callers once the requests in flight
    /// at their pause have finished (new ones are held meanwhile), and stops stepping.
    fn finish_pause_after_in_flight<E: EngineCore>(&mut self, engine: &E) {
        if self.pausing_after_in_flight.is_empty() || engine.has_unfinished() {
            return;
        }
        self.frozen = true;
        for reply in self.pausing_after_in_flight.drain(..) {
            let _ = reply.send(Ok(()));
        }
    }

    /// Brings back what was asked for; awake again once the weights are loaded.
    fn wake_up<E: EngineCore>(&mut self, engine: &mut E, wake: WakeUp) -> Result<Woken> {
        let mut woken = Woken::default();
        if wake.weights && engine.weights_released() {
            engine.restore_weights(&wake.weights_dir)?;
            woken.weights_loaded = true;
        }
        if wake.kv_cache {
            engine.restore_kv_cache()?;
            woken.kv_cache_restored = true;
        }
        // Released KV comes back by itself with the next step; released weights do not.
        self.asleep = engine.weights_released() || (self.asleep && !wake.kv_cache);
        woken.weight_version = engine.stats().weight_version;
        Ok(woken)
    }

    /// Hands a step's events to their listeners; a request nobody listens to is aborted.
    fn route<E: EngineCore>(&mut self, engine: &mut E, events: Vec<EngineEvent>) {
        for event in events {
            let (id, event) = match event {
                EngineEvent::PromptLogprobs { id, logprobs } => {
                    (id, RequestEvent::PromptLogprobs(logprobs))
                }
                EngineEvent::Token(token) => (token.id, RequestEvent::Token(token)),
                EngineEvent::Finished(record) => {
                    if let Some(mut tx) = self.listeners.remove(&record.id) {
                        tx(RequestEvent::Finished(record));
                    }
                    continue;
                }
            };
            let gone = self.listeners.get_mut(&id).is_some_and(|tx| !tx(event));
            if gone {
                self.listeners.remove(&id);
                engine.abort(id);
            }
        }
    }
}
