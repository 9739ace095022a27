//! The episodes of one process in the order they run, and their sandboxes started ahead: while
//! the model generates, up to `warm_pool` sandboxes of the next episodes start (their task's
//! setup run), so an episode that begins finds its sandbox ready and start-up leaves its
//! critical path.
//!
//! ```text
//!   next_group() ─► task t ─► queue  (t,3) (t,4) (t,5) (u,0) ...  ◄─ workers pop the front
//!                                      │     │
//!   warm (at most warm_pool):       Starting Ready(sandbox)        ◄─ fillers claim the first
//!                                                                     queued job not claimed
//! ```
//!
//! A worker that pops a job takes its sandbox if it is ready, waits for it if it is starting,
//! and starts one itself when no filler claimed the job (exposed start-up). A filler pulls the
//! next task group early when every queued job is claimed and the pool has room, so a process
//! holds at most `warm_pool` sandboxes beyond its running episodes. Sandboxes never taken (the
//! rollout deadline passed) are closed when the queue is dropped.

use crate::env::{Environment, Sandbox, Task};
use anyhow::Result;
use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One episode: a task index and a sample of its group.
pub type Job = (usize, usize);

/// A sandbox started for a job before its episode began.
pub struct Prestarted {
    pub sandbox: Result<Box<dyn Sandbox>>,
    /// Seconds the start (and the task's setup) took.
    pub start_s: f64,
    /// Seconds the episode waited for it (0 when it was ready).
    pub wait_s: f64,
}

enum Warm {
    Starting,
    Ready {
        sandbox: Result<Box<dyn Sandbox>>,
        start_s: f64,
    },
}

struct State {
    /// Jobs no worker has taken yet, in the order workers take them.
    queue: VecDeque<Job>,
    /// Jobs a filler claimed (queued or already taken by a waiting worker).
    warm: HashMap<Job, Warm>,
    /// `next_group` said there is no more (or failed: the error is kept).
    exhausted: bool,
    failure: Option<anyhow::Error>,
    /// No more jobs are handed out (the deadline passed or every worker ended).
    closed: bool,
}

/// What the queue needs from its caller.
pub struct QueueSource<'a> {
    pub tasks: &'a [Task],
    pub group: usize,
    /// Hands out the next task group for this process (`None`: there is no more).
    pub next_group: &'a (dyn Fn() -> Result<Option<usize>> + Sync),
    /// Told of every task group pulled, before its jobs are queued.
    pub on_pull: &'a (dyn Fn(usize) + Sync),
    /// Sandboxes started ahead at most (0: none).
    pub warm_pool: usize,
    /// The environment and the name of a job's first sandbox (the episode's own rule).
    pub env: &'a dyn Environment,
    pub sandbox_name: &'a (dyn Fn(Job) -> String + Sync),
}

pub struct JobQueue<'a> {
    source: QueueSource<'a>,
    state: Mutex<State>,
    changed: Condvar,
}

/// How long a filler sleeps between looks at the deadline while it has nothing to do.
const IDLE_POLL: Duration = Duration::from_millis(50);

impl<'a> JobQueue<'a> {
    pub fn new(source: QueueSource<'a>) -> Self {
        Self {
            source,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                warm: HashMap::new(),
                exhausted: false,
                failure: None,
                closed: false,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pulls the next task group into the queue; false when there is none (or it failed).
    fn pull(&self, state: &mut State) -> bool {
        if state.exhausted || state.closed {
            return false;
        }
        match (self.source.next_group)() {
            Ok(Some(t)) => {
                (self.source.on_pull)(t);
                state.queue.extend((0..self.source.group).map(|s| (t, s)));
                self.changed.notify_all();
                true
            }
            Ok(None) => {
                state.exhausted = true;
                self.changed.notify_all();
                false
            }
            Err(e) => {
                state.exhausted = true;
                state.failure = Some(e);
                self.changed.notify_all();
                false
            }
        }
    }

    /// The next job for a worker, pulling a group when none is queued; `None`: no more work.
    pub fn next_job(&self) -> Option<Job> {
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        if state.queue.is_empty() && !self.pull(&mut state) {
            return None;
        }
        let job = state.queue.pop_front();
        self.changed.notify_all();
        job
    }

    /// The sandbox a filler started for `job`, waiting while it starts; `None`: no filler
    /// claimed it (the worker starts one itself).
    pub fn take_sandbox(&self, job: Job) -> Option<Prestarted> {
        let waited = Instant::now();
        let mut state = self.lock();
        loop {
            match state.warm.remove(&job) {
                None => return None,
                Some(Warm::Ready { sandbox, start_s }) => {
                    self.changed.notify_all();
                    return Some(Prestarted {
                        sandbox,
                        start_s,
                        wait_s: waited.elapsed().as_secs_f64(),
                    });
                }
                Some(Warm::Starting) => {
                    state.warm.insert(job, Warm::Starting);
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }

    /// A filler's loop: claim the first queued job no filler claimed, start its sandbox, hand
    /// it over; until the queue closes or no work is left.
    pub fn fill(&self) {
        while let Some(job) = self.claim() {
            let (t, _) = job;
            let started = Instant::now();
            let name = (self.source.sandbox_name)(job);
            let sandbox = self.source.env.start(&self.source.tasks[t], &name);
            let start_s = started.elapsed().as_secs_f64();
            let mut state = self.lock();
            state.warm.insert(job, Warm::Ready { sandbox, start_s });
            self.changed.notify_all();
        }
    }

    fn claim(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return None;
            }
            if state.warm.len() < self.source.warm_pool {
                let unclaimed = state
                    .queue
                    .iter()
                    .copied()
                    .find(|job| !state.warm.contains_key(job));
                if let Some(job) = unclaimed {
                    state.warm.insert(job, Warm::Starting);
                    return Some(job);
                }
                if !state.exhausted {
                    self.pull(&mut state);
                    continue;
                }
                if state.queue.is_empty() {
                    return None; // nothing left to start
                }
            }
            state = self
                .changed
                .wait_timeout(state, IDLE_POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// No more jobs are handed out or claimed: fillers return, workers find no next job.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// The error `next_group` returned, if any.
    pub fn take_failure(&self) -> Option<anyhow::Error> {
        self.lock().failure.take()
    }
}
