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
//! on the engine. [`EngineHandle::pause`] stops stepping (requests keep their state and blocks;
//! commands are still served) until [`EngineHandle::resume`].

use crate::backend::DeviceSpan;
use crate::engine::engine::{EngineEvent, EngineStats, FinalRecord, TokenEvent};
use crate::engine::parallel::EngineCore;
use crate::engine::prompt_logprobs::PromptLogprobs;
use crate::engine::request::GenerationRequest;
use crate::kvcache::RequestId;
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

enum Command {
    Submit(GenerationRequest, EventSink, SubmitReply),
    Abort(RequestId),
    UpdateWeights(PathBuf, Sender<Result<u64>>),
    UpdateWeightsFrom(Arc<Qwen2Params<HostTensor<'static>>>, Sender<Result<u64>>),
    UpdateWeightsFromDevice(Vec<DeviceSpan>, Sender<Result<u64>>),
    ReleaseKv(Sender<Result<usize>>),
    RestoreKv(Sender<Result<()>>),
    Stats(Sender<EngineStats>),
    Pause,
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
        self.send(Command::Submit(request, sink, reply))
    }

    /// Stops stepping after the current step: running and waiting requests keep their state and
    /// blocks, new ones queue, and every command is still served. Idempotent.
    pub fn pause(&self) -> Result<()> {
        self.send(Command::Pause)
    }

    /// Steps again after [`EngineHandle::pause`]. Idempotent.
    pub fn resume(&self) -> Result<()> {
        self.send(Command::Resume)
    }

    /// Ends a request; its receiver gets `Finished` with reason `abort`.
    pub fn abort(&self, id: RequestId) -> Result<()> {
        self.send(Command::Abort(id))
    }

    /// Swaps weights between steps; returns the new weight version.
    pub fn update_weights(&self, dir: PathBuf) -> Result<u64> {
        let (tx, rx) = channel();
        self.send(Command::UpdateWeights(dir, tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    /// Swaps in weights handed over in memory (whole tensors in checkpoint order: a
    /// tensor-parallel engine's ranks each take their part), between steps; returns the new
    /// weight version.
    pub fn update_weights_from(&self, host: Qwen2Params<HostTensor<'static>>) -> Result<u64> {
        let (tx, rx) = channel();
        self.send(Command::UpdateWeightsFrom(Arc::new(host), tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
    }

    /// Overwrites the engine's weights from another backend's device memory on the same device,
    /// between steps (see [`Engine::update_weights_from_device`]); returns the new version.
    ///
    /// # Safety
    /// The spans' memory must stay live and unwritten until this returns.
    pub unsafe fn update_weights_from_device(&self, spans: Vec<DeviceSpan>) -> Result<u64> {
        let (tx, rx) = channel();
        self.send(Command::UpdateWeightsFromDevice(spans, tx))?;
        rx.recv().map_err(|_| anyhow!("the engine has stopped"))?
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

/// The engine thread: takes commands, steps while requests are unfinished and not paused, and
/// hands each step's events to the requests' sinks. Ends at [`Command::Shutdown`] or when every
/// handle is gone.
fn run<E: EngineCore>(engine: E, inbox: Receiver<Command>) {
    let mut thread = EngineThread {
        engine,
        listeners: HashMap::new(),
        paused: false,
    };
    loop {
        let Some(commands) = thread.next_commands(&inbox) else {
            return;
        };
        for command in commands {
            if !thread.handle(command) {
                return;
            }
        }
        if !thread.engine.has_unfinished() || thread.paused {
            continue;
        }
        if let Some(events) = thread.step() {
            thread.deliver(events);
        }
    }
}

/// What the engine thread owns: the engine, each request's event sink, and the pause flag.
struct EngineThread<E: EngineCore> {
    engine: E,
    listeners: HashMap<RequestId, EventSink>,
    paused: bool,
}

impl<E: EngineCore> EngineThread<E> {
    /// Blocks for work when idle or paused; otherwise takes what has arrived. `None` when every
    /// handle is gone.
    fn next_commands(&self, inbox: &Receiver<Command>) -> Option<Vec<Command>> {
        let mut commands = Vec::new();
        if !self.engine.has_unfinished() || self.paused {
            match inbox.recv() {
                Ok(c) => commands.push(c),
                Err(_) => return None,
            }
        }
        commands.extend(inbox.try_iter());
        Some(commands)
    }

    /// Runs one command; `false` at shutdown (every request in flight aborted and told).
    fn handle(&mut self, command: Command) -> bool {
        let engine = &mut self.engine;
        match command {
            Command::Submit(request, events, reply) => match engine.add_request(request) {
                Ok(id) => {
                    self.listeners.insert(id, events);
                    reply(Ok(id));
                }
                Err(e) => reply(Err(e)),
            },
            Command::Abort(id) => {
                if let Some(record) = engine.abort(id) {
                    if let Some(mut tx) = self.listeners.remove(&id) {
                        tx(RequestEvent::Finished(record));
                    }
                }
            }
            Command::Pause => self.paused = true,
            Command::Resume => self.paused = false,
            Command::UpdateWeights(dir, reply) => {
                let _ = reply.send(engine.update_weights(&dir));
            }
            Command::UpdateWeightsFrom(host, reply) => {
                let _ = reply.send(engine.update_weights_from_host(host));
            }
            Command::UpdateWeightsFromDevice(spans, reply) => {
                // SAFETY: the caller of `update_weights_from_device` keeps the spans live
                // and unwritten until it has the reply.
                let _ = reply.send(unsafe { engine.update_weights_from_device(&spans) });
            }
            Command::ReleaseKv(reply) => {
                let _ = reply.send(engine.release_kv_cache());
            }
            Command::RestoreKv(reply) => {
                let _ = reply.send(engine.restore_kv_cache());
            }
            Command::Stats(reply) => {
                let _ = reply.send(engine.stats());
            }
            Command::Shutdown => {
                for (id, mut tx) in self.listeners.drain() {
                    if let Some(record) = engine.abort(id) {
                        tx(RequestEvent::Finished(record));
                    }
                }
                return false;
            }
        }
        true
    }

    /// One engine step. A failed step (out of device memory, a kernel error) ends every request
    /// in flight with the error rather than retrying forever: then `None`.
    fn step(&mut self) -> Option<Vec<EngineEvent>> {
        match self.engine.step() {
            Ok(events) => Some(events),
            Err(e) => {
                let reason = format!("{e:#}");
                for (id, mut tx) in self.listeners.drain() {
                    if let Some(mut record) = self.engine.abort(id) {
                        record.finish_reason = crate::engine::FinishReason::Error(reason.clone());
                        tx(RequestEvent::Finished(record));
                    }
                }
                None
            }
        }
    }

    /// Hands a step's events to their requests' sinks; a sink that says its receiver is gone
    /// aborts its request.
    fn deliver(&mut self, events: Vec<EngineEvent>) {
        let listeners = &mut self.listeners;
        for event in events {
            match event {
                EngineEvent::PromptLogprobs { id, logprobs } => {
                    let gone = listeners
                        .get_mut(&id)
                        .is_some_and(|tx| !tx(RequestEvent::PromptLogprobs(logprobs)));
                    if gone {
                        listeners.remove(&id);
                        self.engine.abort(id);
                    }
                }
                EngineEvent::Token(token) => {
                    let id = token.id;
                    let gone = listeners
                        .get_mut(&id)
                        .is_some_and(|tx| !tx(RequestEvent::Token(token)));
                    if gone {
                        listeners.remove(&id);
                        self.engine.abort(id);
                    }
                }
                EngineEvent::Finished(record) => {
                    if let Some(mut tx) = listeners.remove(&record.id) {
                        tx(RequestEvent::Finished(record));
                    }
                }
            }
        }
    }
}
