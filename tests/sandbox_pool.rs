//! The rollout workers with warm pools and separate knobs (`--sandboxes`, `--warm-pool`) against
//! an environment that counts its sandboxes and sleeps: every episode runs once, every sandbox
//! started is closed (those a deadline left unused too), at most `sandboxes + warm_pool` are
//! alive at once, start-up is hidden when a pool runs and fully exposed when none does, and a
//! slow command holds up only its own episode.

use anyhow::Result;
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use swerve::agent::episode::{Deadline, Episode, EpisodeConfig, EpisodeContext};
use swerve::agent::policy::{tool_call_text, Policy, Script, ScriptedPolicy};
use swerve::agent::rollout::{run_episodes, run_task_groups, GroupPlan, Workers};
use swerve::chat::ChatTemplate;
use swerve::env::{builtin, load_tasks, CommandOutput, Environment, Limits, Sandbox, Task};
use swerve::tokenizer::Tokenizer;

#[derive(Default)]
struct Counters {
    started: AtomicUsize,
    closed: AtomicUsize,
    alive: AtomicUsize,
    max_alive: AtomicUsize,
}

/// Sandboxes that take `start` to start; commands take `command`, or `slow_command` for the
/// episodes whose sandbox name starts with `slow_prefix`.
struct CountingEnvironment {
    start: Duration,
    command: Duration,
    slow: Option<(String, Duration)>,
    counters: Arc<Counters>,
    limits: Limits,
}

struct CountingSandbox {
    command: Duration,
    counters: Arc<Counters>,
    limits: Limits,
    open: bool,
}

impl Environment for CountingEnvironment {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn start(&self, _task: &Task, episode: &str) -> Result<Box<dyn Sandbox>> {
        std::thread::sleep(self.start);
        let c = &self.counters;
        c.started.fetch_add(1, Ordering::SeqCst);
        let alive = c.alive.fetch_add(1, Ordering::SeqCst) + 1;
        c.max_alive.fetch_max(alive, Ordering::SeqCst);
        let command = match &self.slow {
            Some((prefix, slow)) if episode.starts_with(prefix.as_str()) => *slow,
            _ => self.command,
        };
        Ok(Box::new(CountingSandbox {
            command,
            counters: c.clone(),
            limits: self.limits.clone(),
            open: true,
        }))
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }
}

impl Sandbox for CountingSandbox {
    fn workdir(&self) -> &str {
        "/workspace"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn exec(&mut self, _: &str, _: Option<&[u8]>, _: Duration, _: usize) -> Result<CommandOutput> {
        assert!(self.open, "a command ran in a closed sandbox");
        std::thread::sleep(self.command);
        Ok(CommandOutput {
            output: "ok\n".into(),
            exit_code: Some(0),
            elapsed: self.command,
            ..CommandOutput::default()
        })
    }

    fn copy_in(&mut self, _: &Path) -> Result<()> {
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        if std::mem::take(&mut self.open) {
            self.counters.closed.fetch_add(1, Ordering::SeqCst);
            self.counters.alive.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

impl Drop for CountingSandbox {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn environment(start_ms: u64, command_ms: u64) -> (CountingEnvironment, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    let env = CountingEnvironment {
        start: Duration::from_millis(start_ms),
        command: Duration::from_millis(command_ms),
        slow: None,
        counters: counters.clone(),
        limits: Limits::default(),
    };
    (env, counters)
}

/// `commands` bash calls, then a submit.
fn policy(commands: usize) -> ScriptedPolicy {
    let call = tool_call_text("bash", &json!({"command": "true"}));
    ScriptedPolicy {
        tokenizer: Arc::new(Tokenizer::qwen25().unwrap()),
        script: Script::Replies(vec![call; commands]),
    }
}

fn toy_tasks() -> Vec<Task> {
    load_tasks(&builtin::resolve_tasks("builtin:toy").unwrap()).unwrap()
}

/// One tokenizer and template for every run of the process: a tokenizer's first encodes build
/// caches (seconds on a loaded machine), which would otherwise land inside a measurement.
fn qwen() -> &'static (Tokenizer, ChatTemplate) {
    static QWEN: OnceLock<(Tokenizer, ChatTemplate)> = OnceLock::new();
    QWEN.get_or_init(|| {
        let tokenizer = Tokenizer::qwen25().unwrap();
        let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
        (tokenizer, template)
    })
}

fn run(env: &dyn Environment, policy: &dyn Policy, group: usize, workers: Workers) -> Vec<Episode> {
    let (tokenizer, template) = qwen();
    let config = EpisodeConfig::default();
    let ctx = EpisodeContext {
        env,
        policy,
        tokenizer,
        template,
        config: &config,
    };
    run_episodes(&ctx, &toy_tasks(), group, workers, 0, "pool test")
}

#[test]
fn a_warm_pool_hides_start_up_and_closes_every_sandbox() {
    let (env, counters) = environment(150, 30);
    let workers = Workers {
        sandboxes: 3,
        warm_pool: 3,
    };
    let episodes = run(&env, &policy(2), 3, workers);
    assert_eq!(episodes.len(), 12);
    for e in &episodes {
        assert!(
            e.resolved,
            "{} #{} not resolved: {:?}",
            e.task_id, e.sample, e.finish
        );
        assert_eq!(e.turns, 3);
        assert!(e.sandbox_start_s >= 0.15, "start {}", e.sandbox_start_s);
    }
    // One sandbox per episode (graded in place: the toy's command grading) and every one closed.
    assert_eq!(counters.started.load(Ordering::SeqCst), 12);
    assert_eq!(counters.closed.load(Ordering::SeqCst), 12);
    let max_alive = counters.max_alive.load(Ordering::SeqCst);
    assert!(
        max_alive <= 6,
        "{max_alive} sandboxes alive at once, over 3 + 3"
    );
    let hidden: f64 = episodes
        .iter()
        .map(|e| (e.sandbox_start_s - e.sandbox_wait_s).max(0.0))
        .sum();
    // 12 starts of 0.15 s, the first 3 waited for in full at best: most of the rest hidden.
    assert!(
        hidden > 0.6,
        "only {hidden:.3} s of 1.8 s of start-up hidden"
    );
}

#[test]
fn without_a_pool_every_start_is_waited_for() {
    let (env, counters) = environment(50, 10);
    let workers = Workers {
        sandboxes: 4,
        warm_pool: 0,
    };
    let episodes = run(&env, &policy(1), 2, workers);
    assert_eq!(episodes.len(), 8);
    for e in &episodes {
        assert_eq!(e.sandbox_wait_s, e.sandbox_start_s);
        assert!(e.sandbox_start_s >= 0.05);
    }
    assert!(counters.max_alive.load(Ordering::SeqCst) <= 4);
    assert_eq!(counters.closed.load(Ordering::SeqCst), 8);
}

#[test]
fn a_deadline_closes_the_sandboxes_started_ahead() {
    let (env, counters) = environment(20, 100);
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let config = EpisodeConfig::default();
    let policy = policy(3);
    let ctx = EpisodeContext {
        env: &env,
        policy: &policy,
        tokenizer: &tokenizer,
        template: &template,
        config: &config,
    };
    let tasks = toy_tasks();
    let plan = GroupPlan {
        tasks: &tasks,
        group: 8,
        workers: Workers {
            sandboxes: 2,
            warm_pool: 4,
        },
        seed: 0,
        label: "deadline test",
        deadline: Deadline(Some(Instant::now() + Duration::from_millis(250))),
    };
    let next = AtomicUsize::new(0);
    let next_group = || -> Result<Option<usize>> {
        Ok(Some(next.fetch_add(1, Ordering::SeqCst)).filter(|&t| t < tasks.len()))
    };
    let ran = run_task_groups(&ctx, &plan, &next_group).unwrap();
    let finished = ran.groups.values().flatten().flatten().count();
    assert!(finished < 32, "the deadline stopped nothing");
    let started = counters.started.load(Ordering::SeqCst);
    assert!(started > finished, "no sandbox was started ahead");
    assert_eq!(counters.closed.load(Ordering::SeqCst), started);
    assert_eq!(counters.alive.load(Ordering::SeqCst), 0);
}

/// Records when each task's turns were written.
struct TimedPolicy {
    inner: ScriptedPolicy,
    turns: Mutex<Vec<(String, Instant)>>,
}

impl Policy for TimedPolicy {
    fn name(&self) -> String {
        "timed".into()
    }

    fn generate(
        &self,
        input: &swerve::agent::policy::TurnInput<'_>,
    ) -> Result<swerve::agent::policy::TurnOutput> {
        let at = (input.task.id.clone(), Instant::now());
        self.turns.lock().unwrap().push(at);
        self.inner.generate(input)
    }
}

#[test]
fn a_slow_command_holds_up_only_its_own_episode() {
    let (mut env, _) = environment(0, 10);
    let tasks = toy_tasks();
    // The first task's episodes (sandboxes named `{task}-{sample}-...`): commands of 1.5 s.
    env.slow = Some((format!("{}-", tasks[0].id), Duration::from_millis(1500)));
    let policy = TimedPolicy {
        inner: policy(2),
        turns: Mutex::new(Vec::new()),
    };
    let workers = Workers {
        sandboxes: 4,
        warm_pool: 0,
    };
    // Once on a fast environment first: what the first turns initialise (the tokenizer's
    // caches) is not part of the measurement.
    let (fast, _) = environment(0, 0);
    run(&fast, &policy, 1, workers);
    policy.turns.lock().unwrap().clear();
    let episodes = run(&env, &policy, 2, workers);
    assert_eq!(episodes.len(), 8);
    // The slow task's 2 episodes: 2 commands + grading = 4.5 s each, on 2 workers. The other 6
    // episodes (3 turns, 30 ms of commands each) run on the other 2 workers meanwhile: every turn
    // of theirs is written within a second of the first turn, long before a slow episode's second turn.
    let turns = policy.turns.lock().unwrap();
    let started = turns.iter().map(|(_, at)| *at).min().unwrap();
    let others: Vec<f64> = turns
        .iter()
        .filter(|(task, _)| *task != tasks[0].id)
        .map(|(_, at)| at.duration_since(started).as_secs_f64())
        .collect();
    assert_eq!(others.len(), 6 * 3);
    let last = others.iter().cloned().fold(0.0, f64::max);
    assert!(
        last < 1.2,
        "another episode's turn waited until {last:.2} s"
    );
}
