//! The verdict from what a graded run showed: the runner's record (the log as a cross-check),
//! the sandbox's exit status, the canaries; and, where the run is off the rules in a way the
//! task itself might explain, the reference fix's run of the same task.
//!
//! ```text
//!   tampered   a canary off its rule; exit status 0 with a test failed; a record that is not
//!              the grader's shape; a test recorded passed whose own call raised or never ran;
//!              a test wrapped otherwise than in the reference run; a test whose code is not
//!              its file's; the framework changed      (each unless the reference run shows it)
//!   lists      every FAIL_TO_PASS / PASS_TO_PASS id passed (the runner's own pass status);
//!              XFAIL / XPASS only where the reference solution's run shows the same status
//!   no lists   a test passed, none failed or errored, none skipped or XFAIL / XPASS unless the
//!              reference run shows it so, exit status consistent, the run finished
//!   record     expected from every runner but sympy's; absent or unfinished: unresolved,
//!              unless the reference run has none either (then the log is all there is)
//! ```

use super::canary::{self, Anomaly, Canaries};
use super::ledger;
use super::results::{self, Run};
use crate::env::logs::{self, LogParser, TestStatus};
use crate::env::task::{HarnessRules, TestPlan, Verdict};
use crate::env::CommandOutput;
use std::collections::BTreeMap;

/// The runner's record file, as read back.
#[derive(Clone, Debug, PartialEq)]
pub enum Channel {
    Absent,
    Written(String),
    Unreadable(String),
}

/// What one graded run showed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    /// Every non-canary test's status: the runner's record cross-checked with the log, or the
    /// log where there is no record. Canonical ids.
    pub statuses: BTreeMap<String, TestStatus>,
    /// The canaries seen, keyed by place ([`Canaries::observe`]).
    pub canaries: BTreeMap<String, TestStatus>,
    /// Canaries off their rule.
    pub anomalies: Vec<Anomaly>,
    /// The runner's record: present and finished / present but unfinished / none.
    pub recorded: bool,
    pub finished: bool,
    /// Why the record cannot be trusted (lines not of the grader's shape, too big).
    pub record_error: Option<String>,
    /// The sandbox's exit status of the test command (`None`: killed, timed out).
    pub exit_code: Option<i32>,
    /// A test (canary or not) failed or errored, or a file did not collect.
    pub any_failure: bool,
    /// The run's output was cut (over the grader's bound).
    pub truncated: bool,
    /// Tests (canaries included) the log itself reports.
    pub log_tests: usize,
    /// Evidence of tampering beyond the canaries' statuses (the canaries run twice, tests whose
    /// code is not their file's), compared with the reference run's like the anomalies.
    pub notes: Vec<String>,
    /// Tests whose code, as run, is not what their file compiles to.
    pub code_changed: Vec<String>,
    /// The test framework's attributes that changed while the tests ran.
    pub framework_changed: Vec<String>,
    /// Frames obtained while the tests ran by code that is not a library's own ("frame
    /// obtained by calc/ops.py:_find (tb_frame)": the recorders' audit hook).
    pub frames_obtained: Vec<String>,
    /// Tests recorded passed whose own function's call raised or never happened.
    pub forgiven: Vec<String>,
    /// The wrappers around each (non-canary) test's function, where it has any.
    pub wrappers: BTreeMap<String, Vec<String>>,
    /// Each (non-canary) class test's class line as run (`grader_check.class_line`).
    pub bases: BTreeMap<String, Vec<String>>,
}

impl Observation {
    pub fn new(
        plan: &TestPlan,
        canaries: &Canaries,
        installed: &[usize],
        run: &CommandOutput,
        channel: Channel,
    ) -> Observation {
        let log = logs::parse_log(plan.parser, &run.output);
        let mut observation = Observation {
            exit_code: run.exit_code,
            truncated: run.omitted_bytes > 0,
            ..Observation::default()
        };
        observation.log_tests = log.len();
        let mut collect_errors = false;
        let all = match channel {
            Channel::Written(text) => match results::parse_runs(plan.parser, &text) {
                Ok(runs) => {
                    let with_canaries = runs
                        .iter()
                        .filter(|r| r.statuses.keys().any(|id| canaries.is_canary(id)))
                        .count();
                    if with_canaries > 1 {
                        observation.notes.push(format!(
                            "the grader's canaries ran in {with_canaries} test runs"
                        ));
                    }
                    match main_run(runs, canaries) {
                        Some(main) => {
                            // A second run of the tests started from inside the first (tox's
                            // pytest does this; a change that reruns its own rewritten tests
                            // does too), or a record the command's process does not vouch for
                            // (ledger.rs): as the reference run shows it.
                            let owner = ledger::ownership_note(&text, &run.output, &main.id)
                                .filter(|_| main.finished);
                            let lineage = main.descendant.then_some(ledger::NOT_FIRST);
                            let hook = ledger::hook_notes(&run.output);
                            let notes = [lineage, owner].into_iter().flatten();
                            let notes = notes.map(str::to_string).chain(hook);
                            for note in notes {
                                if !observation.notes.contains(&note) {
                                    observation.notes.push(note);
                                }
                            }
                            let run = main;
                            observation.recorded = true;
                            observation.finished = run.finished;
                            collect_errors = !run.collect_errors.is_empty();
                            observation.code_changed = run.code_changed.clone();
                            let (frames, changed): (Vec<String>, Vec<String>) = run
                                .framework_changed
                                .iter()
                                .map(|name| canaries.normalize(name))
                                .partition(|name| name.starts_with(FRAME_OBTAINED));
                            observation.framework_changed = changed;
                            observation.frames_obtained = frames;
                            observation.forgiven = run.forgiven.clone();
                            let own = |map: &BTreeMap<String, Vec<String>>| {
                                map.iter()
                                    .filter(|(id, _)| !canaries.is_canary(id))
                                    .map(|(id, links)| (id.clone(), links.clone()))
                                    .collect()
                            };
                            observation.wrappers = own(&run.wrappers);
                            observation.bases = own(&run.bases);
                            results::cross_check(&run.statuses, &log)
                        }
                        None => log.clone(),
                    }
                }
                Err(why) => {
                    observation.record_error = Some(why);
                    log.clone()
                }
            },
            Channel::Unreadable(why) => {
                observation.record_error = Some(why);
                log.clone()
            }
            Channel::Absent => log.clone(),
        };
        observation.any_failure = collect_errors || all.values().any(|s| s.is_fail());
        observation.canaries = canaries.observe(&all);
        observation.anomalies = canaries.anomalies(&observation.canaries, plan.parser, installed);
        // A canary the log reports otherwise than the record: the log was rewritten.
        let log_canaries = canaries.observe(&log);
        for (key, status) in &log_canaries {
            if observation.canaries.get(key).is_some_and(|s| s != status) {
                observation.anomalies.push(Anomaly {
                    key: key.clone(),
                    status: Some(TestStatus::Conflict),
                });
            }
        }
        observation.statuses = all
            .into_iter()
            .filter(|(id, _)| !canaries.is_canary(id))
            .collect();
        observation
    }
}

/// The test command's run among the runs of the record: the first that ran a canary, else the
/// first that started.
fn main_run(runs: Vec<Run>, canaries: &Canaries) -> Option<Run> {
    let with_canary = runs
        .iter()
        .position(|r| r.statuses.keys().any(|id| canaries.is_canary(id)));
    let index = with_canary.or_else(|| runs.iter().position(|r| r.started))?;
    runs.into_iter().nth(index)
}

/// How the recorders name a frame obtained by code under test (`grader_check.py`).
const FRAME_OBTAINED: &str = "frame obtained by ";

/// A verdict, and whether a reference run could change it.
pub struct Decision {
    pub verdict: Verdict,
    /// Off the rules in a way the reference run might explain: decide again with it.
    pub needs_reference: bool,
}

/// The verdict on `observed`, `reference` the reference fix's run of the task (or the pristine
/// task's, where it has no reference fix) when one was needed.
pub fn decide(plan: &TestPlan, observed: &Observation, reference: Option<&Reference>) -> Decision {
    let mut needs_reference = false;
    let tampered = tamper_evidence(observed, reference, &mut needs_reference);
    let mut problems = run_problems(plan, observed, reference, &mut needs_reference);
    let passed = observed.statuses.values().filter(|s| s.is_pass()).count();
    let failed = observed.statuses.values().filter(|s| s.is_fail()).count();
    let lists = !plan.fail_to_pass.is_empty() || !plan.pass_to_pass.is_empty();
    let not_passing = not_passing(plan, observed, reference, &mut needs_reference);
    let tests_ok = if lists {
        not_passing.is_empty()
    } else {
        passed > 0 && failed == 0 && not_passing.is_empty()
    };
    if !lists {
        match observed.exit_code {
            Some(code) if code != 0 && !observed.any_failure => problems.push(format!(
                "the test command exited {code} with no test failing"
            )),
            _ => {}
        }
    }
    let mut tampered = tampered;
    if tests_ok {
        // Frames taken by code under test matter where the tests pass: a failing run's own
        // code (a repository that formats its tracebacks itself) may take frames the reference
        // run never needed.
        needs_reference |= !observed.frames_obtained.is_empty();
        tampered.extend(unexcused_evidence(
            &observed.frames_obtained,
            reference,
            |o| &o.frames_obtained,
            "code under test reached into the running tests",
        ));
    }
    let resolved = tampered.is_empty() && problems.is_empty() && tests_ok;
    Decision {
        verdict: Verdict {
            resolved,
            passed,
            failed,
            not_passing,
            tampered,
            problems,
        },
        needs_reference: needs_reference && reference.is_none(),
    }
}

/// Evidence of tampering the reference run does not show too: canaries off their rule, notes,
/// tests whose code is not their file's, an untrustworthy record, exit 0 over failures.
fn tamper_evidence(
    observed: &Observation,
    reference: Option<&Reference>,
    needs_reference: &mut bool,
) -> Vec<String> {
    let mut tampered = Vec::new();
    let anomalies = match reference {
        Some(r) => canary::unexcused(
            observed.anomalies.clone(),
            &r.observation.canaries,
            &r.observation.anomalies,
        ),
        None => observed.anomalies.clone(),
    };
    *needs_reference |= !anomalies.is_empty();
    tampered.extend(anomalies.iter().map(Anomaly::describe));
    for note in &observed.notes {
        *needs_reference = true;
        if !reference.is_some_and(|r| r.observation.notes.contains(note)) {
            tampered.push(note.clone());
        }
    }
    let lists: [(&[String], Evidence, &str); 3] = [
        (
            &observed.code_changed,
            |o| &o.code_changed,
            "tests whose code as run is not their file's",
        ),
        (
            &observed.framework_changed,
            |o| &o.framework_changed,
            "the test framework changed while the tests ran",
        ),
        (
            &observed.forgiven,
            |o| &o.forgiven,
            "tests recorded passed although their own function's call raised, never ran or was not witnessed",
        ),
    ];
    for (seen, of_reference, what) in lists {
        *needs_reference |= !seen.is_empty();
        tampered.extend(unexcused_evidence(seen, reference, of_reference, what));
    }
    let rewrapped = rewrapped(observed, reference);
    *needs_reference |= !observed.wrappers.is_empty();
    if !rewrapped.is_empty() {
        tampered.push(format!(
            "tests wrapped otherwise than in the reference run: {}",
            rewrapped.join("; ")
        ));
    }
    let rebased = rebased(observed, reference);
    *needs_reference |= !observed.bases.is_empty();
    if !rebased.is_empty() {
        tampered.push(format!(
            "tests whose classes inherit otherwise than in the reference run: {}",
            rebased.join("; ")
        ));
    }
    if let Some(why) = &observed.record_error {
        tampered.push(format!("the runner's record cannot be trusted: {why}"));
    }
    if observed.any_failure && observed.exit_code == Some(0) {
        let explained = reference
            .is_some_and(|r| r.observation.any_failure && r.observation.exit_code == Some(0));
        *needs_reference = true;
        if !explained {
            tampered.push("the test command exited 0 although tests failed".to_string());
        }
    }
    tampered
}

/// One list of evidence, read off an observation.
type Evidence = fn(&Observation) -> &[String];

/// "`what`: a, b" for the entries of `seen` the reference run (`of_reference`) does not show
/// too; nothing where all are excused. Without a reference, every entry counts.
fn unexcused_evidence(
    seen: &[String],
    reference: Option<&Reference>,
    of_reference: Evidence,
    what: &str,
) -> Option<String> {
    let left: Vec<&str> = seen
        .iter()
        .filter(|s| !reference.is_some_and(|r| of_reference(&r.observation).contains(s)))
        .map(String::as_str)
        .collect();
    (!left.is_empty()).then(|| format!("{what}: {}", left.join(", ")))
}

/// The tests whose function runs inside wrappers the reference run does not show around it
/// (a decorator the task's own file applies shows in both). A test the reference run does not
/// have (one the change added) is the change's own business; without a reference, every
/// wrapped test is listed.
fn rewrapped(observed: &Observation, reference: Option<&Reference>) -> Vec<String> {
    observed
        .wrappers
        .iter()
        .filter(|(id, links)| match reference {
            None => true,
            Some(r) => {
                let known = r.observation.statuses.contains_key(*id)
                    || r.observation.wrappers.contains_key(*id);
                known && r.observation.wrappers.get(*id) != Some(*links)
            }
        })
        .map(|(id, links)| format!("{id} (in {})", links.join(" < ")))
        .collect()
}

/// The class tests whose class line (what the class inherits from, where each class's code
/// is) differs from the reference run's for the same test: a base put in at run time. Without
/// a reference, or for a test it does not have, nothing is listed.
fn rebased(observed: &Observation, reference: Option<&Reference>) -> Vec<String> {
    let Some(r) = reference else {
        return Vec::new();
    };
    observed
        .bases
        .iter()
        .filter(|(id, line)| {
            r.observation
                .bases
                .get(*id)
                .is_some_and(|known| known != *line)
        })
        .map(|(id, line)| format!("{id} ({})", line.join(" > ")))
        .collect()
}

/// Why the run does not count, tampering apart: no record where one is expected, an unfinished
/// run, a silent log, a killed command, a log over the bound.
fn run_problems(
    plan: &TestPlan,
    observed: &Observation,
    reference: Option<&Reference>,
    needs_reference: &mut bool,
) -> Vec<String> {
    let expects_record =
        plan.parser.expects_record() && reference.is_none_or(|r| r.observation.recorded);
    let mut problems = Vec::new();
    if expects_record && !observed.recorded {
        *needs_reference = true;
        problems.push("the runner's record of its tests is missing".to_string());
    } else if expects_record && !observed.finished {
        problems.push("the test run did not finish".to_string());
    }
    if observed.recorded && observed.log_tests == 0 && !observed.statuses.is_empty() {
        // The runner's record has tests its log does not show: a quiet command, or a log
        // silenced so that it cannot contradict the record.
        *needs_reference = true;
        if reference.is_some_and(|r| r.observation.log_tests > 0) {
            problems
                .push("the log reports no test, where the reference run's log does".to_string());
        }
    }
    if observed.exit_code.is_none() {
        problems.push("the test command was killed or timed out".to_string());
    }
    if observed.truncated {
        problems.push("the test log is over the grader's bound".to_string());
    }
    problems
}

/// The tests that do not pass: listed ones not passed (an XFAIL / XPASS only where the reference
/// fix's run shows the same; a skip as [`HarnessRules`] says, and only where the reference fix's
/// run shows the same), and without lists any skip or XFAIL / XPASS the reference run does not
/// show the same way (the code under test can raise them itself).
fn not_passing(
    plan: &TestPlan,
    observed: &Observation,
    reference: Option<&Reference>,
    needs_reference: &mut bool,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let lists = !plan.fail_to_pass.is_empty() || !plan.pass_to_pass.is_empty();
    let listed = (plan.fail_to_pass.iter().map(|id| (id, true)))
        .chain(plan.pass_to_pass.iter().map(|id| (id, false)));
    for (id, fail_to_pass) in listed {
        let status = logs::lookup(&observed.statuses, id);
        // Harness 5.0 fails a skipped FAIL_TO_PASS test whatever the reference shows.
        let excusable = match status {
            Some(TestStatus::XFail | TestStatus::XPass) => true,
            Some(TestStatus::Skipped) => !(fail_to_pass && plan.rules == HarnessRules::V5),
            _ => false,
        };
        match status {
            Some(TestStatus::Passed) => {}
            Some(status) if excusable => {
                *needs_reference = true;
                let same = reference.is_some_and(|r| {
                    r.is_fix && logs::lookup(&r.observation.statuses, id) == Some(status)
                });
                if !same {
                    out.push((id.clone(), status.name().to_string()));
                }
            }
            Some(status) => out.push((id.clone(), status.name().to_string())),
            None => out.push((id.clone(), "missing".to_string())),
        }
    }
    if lists {
        return out;
    }
    // Without lists, the tests that pass in the reference run are the lists: each must be
    // present and passed here too (a test the code under test kept from running, or dropped from
    // the suite, is not a pass).
    *needs_reference = true;
    if let Some(r) = reference {
        for (id, status) in &r.observation.statuses {
            if status.is_pass() && !observed.statuses.get(id).is_some_and(|s| s.is_pass()) {
                let seen = observed.statuses.get(id).map_or("missing", |s| s.name());
                out.push((id.clone(), seen.to_string()));
            }
        }
    }
    for (id, &status) in &observed.statuses {
        if matches!(
            status,
            TestStatus::Skipped | TestStatus::XFail | TestStatus::XPass
        ) && reference.is_none_or(|r| r.observation.statuses.get(id) != Some(&status))
            && !out.iter().any(|(seen, _)| seen == id)
        {
            out.push((id.clone(), status.name().to_string()));
        }
    }
    out
}

/// A reference run: the task's reference fix (`is_fix`) or, where it has none, its starting
/// state, graded once per task.
#[derive(Clone, Debug)]
pub struct Reference {
    pub observation: Observation,
    pub is_fix: bool,
}

impl Observation {
    /// What a run whose log is all there is shows, as if the runner's record agreed with it
    /// (no canaries): for tests of the verdict rules.
    pub fn from_log(parser: LogParser, log: &str, exit_code: Option<i32>) -> Observation {
        let statuses = logs::parse_log(parser, log);
        Observation {
            any_failure: statuses.values().any(|s| s.is_fail()),
            statuses,
            recorded: true,
            finished: true,
            exit_code,
            ..Observation::default()
        }
    }
}
