//! The engine handle's pauses and sleep, with the CPU backend and a fixture model: a pause holds
//! every later submission outside the engine until the resume; `pause_after_in_flight` lets the
//! requests in the engine finish (frozen ones too) and returns then; `abort_all` ends held
//! submissions too; a sleep releases the KV cache and refuses the held submissions and every
//! later one with [`EngineAsleep`] in the same command, so nothing allocates the cache again.

mod common;

use common::fixture_dir;
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;
use swerve::backend::cpu::CpuBackend;
use swerve::engine::{
    Engine, EngineAsleep, EngineConfig, EngineHandle, FinalRecord, FinishReason, GenerationRequest,
    RequestEvent, SamplingParams,
};
use swerve::kvcache::RequestId;

const MODEL: &str = "tied-gqa4-bf16"; // vocab 320, context 128

fn spawn_engine() -> EngineHandle {
    EngineHandle::spawn(|| {
        let backend = CpuBackend::with_threads(1);
        let model = swerve::model::Qwen2Model::load(&backend, &fixture_dir(MODEL))?;
        Engine::new(backend, model, EngineConfig::for_model(128, 64))
    })
    .unwrap()
}

fn greedy(max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt: (1..20).collect(),
        params: SamplingParams::greedy(),
        max_tokens,
        stop_ids: vec![],
        prompt_logprobs: None,
    }
}

/// A submission through `submit_with`: the id (or refusal) and the events, as they come.
struct Submitted {
    reply: Receiver<anyhow::Result<RequestId>>,
    events: Receiver<RequestEvent>,
}

impl Submitted {
    fn new(handle: &EngineHandle, request: GenerationRequest) -> Submitted {
        let (events_tx, events) = channel();
        let (reply_tx, reply) = channel();
        handle
            .submit_with(
                request,
                Box::new(move |event| events_tx.send(event).is_ok()),
                Box::new(move |result| {
                    let _ = reply_tx.send(result);
                }),
            )
            .unwrap();
        Submitted { reply, events }
    }

    /// Neither an id nor an event yet (it is held).
    fn is_untouched(&self) -> bool {
        self.reply.try_recv().is_err() && self.events.try_recv().is_err()
    }

    /// Its `Finished` record (after its reply, which may have been read already).
    fn finished(self) -> FinalRecord {
        for event in self.events.iter() {
            if let RequestEvent::Finished(record) = event {
                return record;
            }
        }
        panic!("no Finished event");
    }
}

/// The `held` count, polled until it is `want` (the thread takes commands between steps).
fn wait_held(handle: &EngineHandle, want: usize) {
    for _ in 0..500 {
        if handle.stats().unwrap().held == want {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("held: {:?}", handle.stats().unwrap());
}

#[test]
fn pause_after_in_flight_finishes_the_requests_in_flight_and_holds_the_new_ones() {
    let handle = std::sync::Arc::new(spawn_engine());
    let running = Submitted::new(&handle, greedy(60));
    running.reply.recv().unwrap().unwrap();
    // Frozen by a first pause; a request after it is held, outside the engine.
    handle.pause().unwrap();
    let held = Submitted::new(&handle, greedy(4));
    wait_held(&handle, 1);
    let stats = handle.stats().unwrap();
    assert_eq!((stats.running + stats.waiting, stats.held), (1, 1));
    std::thread::sleep(Duration::from_millis(100));
    assert!(held.is_untouched());

    // The frozen request runs to its end; the held one stays held, and the pause returns.
    let pauser = handle.clone();
    let pause = std::thread::spawn(move || pauser.pause_after_in_flight());
    let record = running.finished();
    assert_eq!(record.finish_reason, FinishReason::Length);
    assert_eq!(record.output_tokens.len(), 60);
    pause.join().unwrap().unwrap();
    let stats = handle.stats().unwrap();
    assert_eq!((stats.running, stats.waiting, stats.held), (0, 0, 1));
    // Paused now: nothing steps, later submissions are held too.
    let later = Submitted::new(&handle, greedy(3));
    wait_held(&handle, 2);
    let steps = handle.stats().unwrap().steps;
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(handle.stats().unwrap().steps, steps);
    assert!(held.is_untouched() && later.is_untouched());

    handle.resume().unwrap();
    assert_eq!(held.finished().output_tokens.len(), 4);
    assert_eq!(later.finished().output_tokens.len(), 3);

    // Without an earlier pause: one that finds nothing in flight returns at once, and holds
    // what comes after it.
    handle.pause_after_in_flight().unwrap();
    let after = Submitted::new(&handle, greedy(2));
    wait_held(&handle, 1);
    assert!(after.is_untouched());
    handle.resume().unwrap();
    assert_eq!(after.finished().output_tokens.len(), 2);
}

#[test]
fn abort_all_ends_the_requests_in_the_engine_and_the_held_ones() {
    let handle = spawn_engine();
    let running = Submitted::new(&handle, greedy(100));
    running.reply.recv().unwrap().unwrap();
    handle.pause().unwrap();
    let held = Submitted::new(&handle, greedy(4));
    wait_held(&handle, 1);
    handle.abort_all().unwrap();
    assert_eq!(running.finished().finish_reason, FinishReason::Abort);
    let record = held.finished();
    assert_eq!(record.finish_reason, FinishReason::Abort);
    assert!(record.output_tokens.is_empty());
    let stats = handle.stats().unwrap();
    assert_eq!((stats.running, stats.waiting, stats.held), (0, 0, 0));
    assert_eq!(stats.kv_used_blocks, 0);
}

/// The refusal a submission gets while asleep.
fn asleep_refusal(handle: &EngineHandle) -> EngineAsleep {
    let error = handle
        .submit(greedy(2))
        .expect_err("a submission while asleep");
    *error
        .downcast_ref::<EngineAsleep>()
        .unwrap_or_else(|| panic!("not an EngineAsleep refusal: {error:#}"))
}

#[test]
fn a_submission_after_sleep_is_refused_and_the_kv_cache_stays_released() {
    let handle = spawn_engine();
    Submitted::new(&handle, greedy(3)).finished();
    assert!(handle.stats().unwrap().kv_cache_allocated);

    // The first submission after the sleep is refused, and allocates nothing.
    assert!(handle.sleep(1).unwrap().kv_cache_bytes > 0);
    assert_eq!(asleep_refusal(&handle), EngineAsleep { level: 1 });
    let stats = handle.stats().unwrap();
    assert!(!stats.kv_cache_allocated);
    assert_eq!((stats.running, stats.waiting, stats.held), (0, 0, 0));
    // Refused, not held, while paused too: a wake-up may be a training step away.
    handle.pause().unwrap();
    assert_eq!(asleep_refusal(&handle), EngineAsleep { level: 1 });
    assert_eq!(handle.stats().unwrap().held, 0);
    handle.resume().unwrap();

    // Awake: runs again, with the cache back.
    handle.wake_up(fixture_dir(MODEL), true, true).unwrap();
    assert!(handle.stats().unwrap().kv_cache_allocated);
    assert_eq!(
        Submitted::new(&handle, greedy(3))
            .finished()
            .output_tokens
            .len(),
        3
    );

    // A request in the engine, even frozen, stops a sleep; one held by the pause does not:
    // it never started, and is refused as asleep.
    let frozen = Submitted::new(&handle, greedy(100));
    frozen.reply.recv().unwrap().unwrap();
    handle.pause().unwrap();
    let held = Submitted::new(&handle, greedy(2));
    wait_held(&handle, 1);
    assert!(handle.sleep(1).is_err());
    assert_eq!(handle.stats().unwrap().held, 1);
    handle.abort_all().unwrap();
    assert_eq!(frozen.finished().finish_reason, FinishReason::Abort);
    held.finished();
    let held = Submitted::new(&handle, greedy(2));
    wait_held(&handle, 1);
    handle.sleep(2).unwrap();
    let refusal = held.reply.recv().unwrap().unwrap_err();
    assert_eq!(
        refusal.downcast_ref::<EngineAsleep>(),
        Some(&EngineAsleep { level: 2 })
    );
    assert_eq!(handle.stats().unwrap().held, 0);
    assert_eq!(asleep_refusal(&handle), EngineAsleep { level: 2 });
    assert!(!handle.stats().unwrap().kv_cache_allocated);
}
