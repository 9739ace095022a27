//! The reference run of a task: its reference fix (`patch` / `solution`) graded like an
//! agent's change, or its starting state where it has none, once per task and process. It
//! decides only what the task itself might explain: a canary a selective command never runs, a
//! class the task skips, an upstream XFAIL, a runner that keeps no record.

use super::verdict::Reference;
use super::{observe_in, Change, Observed};
use crate::env::task::TestPlan;
use crate::env::{Environment, Task};
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

type Slot = Arc<Mutex<Option<Reference>>>;

/// Reference runs by environment kind, task origin and id (failures are not kept).
fn cache() -> &'static Mutex<HashMap<String, Slot>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The task's reference run, graded on a fresh sandbox the first time it is asked for.
pub fn observation(
    env: &dyn Environment,
    task: &Task,
    plan: &TestPlan,
    episode: &str,
) -> Result<Reference> {
    let key = format!("{}\0{}\0{}", env.name(), task.origin, task.id);
    let slot = cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_default()
        .clone();
    let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(reference) = guard.as_ref() {
        return Ok(reference.clone());
    }
    let (change, is_fix) = match (&task.gold_patch, &task.solution) {
        (Some(patch), _) => (Change::Diff(patch), true),
        (None, Some(folder)) => (Change::Folder(folder), true),
        (None, None) => (Change::Diff(""), false),
    };
    let mut sandbox = env.start(task, &format!("{episode}-reference"))?;
    let observed = observe_in(sandbox.as_mut(), task, plan, change);
    let _ = sandbox.close();
    let observation = match observed? {
        Observed::Ran(observation, _) => *observation,
        Observed::NotApplied(result) => bail!(
            "task {} ({}): its reference fix does not apply: {}",
            task.id,
            task.origin,
            result.failure.unwrap_or_default()
        ),
    };
    let reference = Reference {
        observation,
        is_fix,
    };
    *guard = Some(reference.clone());
    Ok(reference)
}

/// The paths the task's reference fix changes (its changes to the runner are the agent's to
/// make too).
pub fn changed_paths(task: &Task) -> Result<Vec<String>> {
    let mut paths = Vec::new();
    if let Some(patch) = &task.gold_patch {
        for (a, b) in crate::env::repos::patch_paths(patch) {
            paths.extend(a.into_iter().chain(b));
        }
    }
    if let Some(folder) = &task.solution {
        crate::env::task::files_under(folder, folder, &mut paths)?;
    }
    Ok(paths)
}
