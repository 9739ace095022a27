//! Whose run the command's run is (issue 34, fourteenth red-team pass). A process the tests start
//! can record a run of its own on rewritten tests, with its environment stripped of any lineage
//! mark, and a process without the recorders can append any record it likes to the results file
//! (the file and its path are the sandbox's). So the command's run is trusted only as its first
//! Python process vouches for it (`grader_check.py`'s ledger):
//!
//! ```text
//!   log, as that process starts:  swerve-grader: process PID key SHA256(SECRET)
//!   log, at its exit:             swerve-grader: exit {"pid": PID, "secret": SECRET,
//!                                   "runs": {"PID-N": [LINES, SHA256 OF THOSE LINES]}}
//! ```
//!
//! The key is printed before any workspace code runs, and the log keeps what came first whatever
//! later processes print; the secret lives only in that process (a closure) until it exits, and
//! leaves it on the log (through a descriptor duplicated at start), never on the results file,
//! which the process could rewrite after its exit handlers ran (the sixteenth pass did). The
//! command's run must be that process's, and its lines in the results file exactly the ones that
//! process counted. Anything else is noted (tampering unless the reference run shows the same).

use ring::digest::{digest, SHA256};
use serde_json::Value;

/// Printed by the command's first test process as it starts (`grader_sitecustomize.py`'s ledger book).
const KEY_LINE: &str = "swerve-grader: process ";
/// Printed by every graded process at its exit.
const EXIT_LINE: &str = "swerve-grader: exit ";

/// The run was recorded by another process than the command's first.
pub const NOT_FIRST: &str = "the tests ran in a process another test process started";
/// No key in the log: the command's first process never started the grader's hooks.
pub const NO_KEY: &str = "the command's first test process printed no grader key";
/// No exit record with the secret behind the key: the process did not end through Python's exit.
pub const NOT_CLOSED: &str = "the command's test process ended without closing its record";
/// Lines under the run's id that the process did not write, or lines it wrote that are gone.
pub const NOT_ITS_OWN: &str = "the record of the command's run is not the lines its process wrote";
/// Printed the moment the grader's seal watch finds its own installed code changed
/// (`grader_sitecustomize.py`, 5): `swerve-grader: rewired PID WHAT`.
const REWIRED_LINE: &str = "swerve-grader: rewired ";
/// The grader's recorders, ledger or checks rewired in place (a closure cell, a default, a
/// function's code, a namespace entry) while the tests ran.
pub const REWIRED: &str = "the grader's own code was rewired while the tests ran";

/// Printed by the audit hook the first time a value whose type the workspace defines passed an
/// equality assertion while equal to a value a truthful one is not equal to
/// (`grader_values.py`): `swerve-grader: lie PID WHAT`.
const LIE_LINE: &str = "swerve-grader: lie ";
/// A value that lies passed an equality assertion.
pub const LIE: &str = "a value compared equal to the expected value and to another";

/// Printed by the audit hook when a module runs from a file written after the command's first
/// process started, in the workspace, a copy of its packages or a folder on the start-up path
/// (`grader_sitecustomize.py`, 4b): `swerve-grader: written PID PATH`.
const WRITTEN_LINE: &str = "swerve-grader: written ";
/// Code the change did not show ran: a module written while the tests ran (followed by its path,
/// so that only the reference run's own such module is excused).
pub const WRITTEN: &str = "a module ran from a file written while the tests ran";
/// At most this many written modules are named.
const WRITTEN_NAMED: usize = 4;

/// The notes, if any, on what the command's first process's audit hook reported: its grader
/// code changed ([`REWIRED`]), a lying value passing an assertion ([`LIE`]), a module run from a
/// file written during the run ([`WRITTEN`]: PATH).
pub fn hook_notes(log: &str) -> Vec<String> {
    let Some((pid, _)) = first_key(log) else {
        return Vec::new();
    };
    let mut notes: Vec<String> = [(REWIRED_LINE, REWIRED), (LIE_LINE, LIE)]
        .into_iter()
        .filter(|(line, _)| {
            let line = format!("{line}{pid} ");
            log.lines().any(|l| l.contains(&line))
        })
        .map(|(_, note)| note.to_string())
        .collect();
    let written = format!("{WRITTEN_LINE}{pid} ");
    for line in log.lines() {
        let Some((_, path)) = line.split_once(&written) else {
            continue;
        };
        let note = format!("{WRITTEN}: {}", path.trim_end());
        if !notes.contains(&note) && notes.len() < WRITTEN_NAMED + 2 {
            notes.push(note);
        }
    }
    notes
}

/// The note, if any, on taking run `run_id` of `results` (the results file) as the command's,
/// given the command's `log`.
pub fn ownership_note(results: &str, log: &str, run_id: &str) -> Option<&'static str> {
    let Some((pid, key)) = first_key(log) else {
        return Some(NO_KEY);
    };
    if run_id.split('-').next() != Some(pid.to_string().as_str()) {
        return Some(NOT_FIRST);
    }
    // The first exit line whose secret hashes to the key: printed by the process itself, before
    // the secret was known to anyone else.
    let exit = log
        .lines()
        .filter_map(|line| line.strip_prefix(EXIT_LINE))
        .filter_map(|json| serde_json::from_str::<Value>(json).ok())
        .filter(|v| v["pid"].as_u64() == Some(pid))
        .find(|v| {
            v["secret"]
                .as_str()
                .is_some_and(|s| sha256_hex(s.as_bytes()) == key)
        });
    let Some(exit) = exit else {
        return Some(NOT_CLOSED);
    };
    let vouched = &exit["runs"][run_id];
    let (count, hash) = run_lines(results, run_id);
    let matches = vouched[0].as_u64() == Some(count as u64) && vouched[1].as_str() == Some(&hash);
    (!matches).then_some(NOT_ITS_OWN)
}

/// The first key line of the log: (pid, key).
fn first_key(log: &str) -> Option<(u64, String)> {
    let rest = log.lines().find_map(|line| line.strip_prefix(KEY_LINE))?;
    let mut words = rest.split_whitespace();
    let pid = words.next()?.parse().ok()?;
    (words.next() == Some("key")).then_some(())?;
    let key = words.next()?;
    (key.len() == 64).then(|| (pid, key.to_string()))
}

/// How many lines of `results` belong to run `run_id`, and the SHA-256 of those lines (each
/// with its newline), in file order: what the process's ledger counted as it wrote them.
fn run_lines(results: &str, run_id: &str) -> (usize, String) {
    let mut count = 0;
    let mut bytes = Vec::new();
    for line in results.lines() {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if value["run"].as_str() == Some(run_id) {
            count += 1;
            bytes.extend_from_slice(line.as_bytes());
            bytes.push(b'\n');
        }
    }
    (count, sha256_hex(&bytes))
}

fn sha256_hex(bytes: &[u8]) -> String {
    digest(&SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const SECRET: &str = "00112233445566778899aabbccddeeff";

    /// Per run id, for tests: the `runs` field of an exit record vouching for `results` as written.
    fn vouch(results: &str) -> BTreeMap<String, (usize, String)> {
        let mut ids: Vec<String> = Vec::new();
        for line in results.lines() {
            if let Some(id) = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v["run"].as_str().map(str::to_string))
            {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids.into_iter()
            .map(|id| {
                let lines = run_lines(results, &id);
                (id, lines)
            })
            .collect()
    }

    fn exit_line(pid: u64, secret: &str, runs: &BTreeMap<String, (usize, String)>) -> String {
        let runs: serde_json::Map<String, Value> = runs
            .iter()
            .map(|(id, (n, h))| (id.clone(), serde_json::json!([n, h])))
            .collect();
        let summary = serde_json::json!({"pid": pid, "secret": secret, "runs": runs});
        format!("{EXIT_LINE}{summary}")
    }

    #[test]
    fn only_the_first_process_vouched_run_is_the_commands() {
        let key = sha256_hex(SECRET.as_bytes());
        let start = format!("{KEY_LINE}7 key {key}\nsome output\n{KEY_LINE}9 key {key}\n");
        let run = "{\"ev\": \"start\", \"run\": \"7-0\"}\n{\"ev\": \"end\", \"run\": \"7-0\"}\n";
        let log = |exits: &[String]| format!("{start}{}\n", exits.join("\n"));
        let honest = log(&[exit_line(7, SECRET, &vouch(run))]);
        assert_eq!(ownership_note(run, &honest, "7-0"), None);
        // Another process's run; no key; no exit line; a wrong secret; an exit line in the
        // results file (which the process could rewrite after its exit) counts for nothing.
        assert_eq!(ownership_note(run, &honest, "9-0"), Some(NOT_FIRST));
        assert_eq!(ownership_note(run, "plain log\n", "7-0"), Some(NO_KEY));
        assert_eq!(ownership_note(run, &start, "7-0"), Some(NOT_CLOSED));
        let forged = log(&[exit_line(7, "ff", &vouch(run))]);
        assert_eq!(ownership_note(run, &forged, "7-0"), Some(NOT_CLOSED));
        let in_results = format!("{run}{}\n", exit_line(7, SECRET, &vouch(run)));
        assert_eq!(ownership_note(&in_results, &start, "7-0"), Some(NOT_CLOSED));
        // A line added under the run's id, before or after; a line dropped.
        let extra = "{\"ev\": \"test\", \"id\": \"t\", \"run\": \"7-0\", \"status\": \"passed\"}\n";
        for results in [format!("{extra}{run}"), format!("{run}{extra}")] {
            assert_eq!(ownership_note(&results, &honest, "7-0"), Some(NOT_ITS_OWN));
        }
        let dropped = format!("{}\n", run.lines().next().unwrap());
        assert_eq!(ownership_note(&dropped, &honest, "7-0"), Some(NOT_ITS_OWN));
        // A later exit line (printed once the secret is out) does not replace the first.
        let rewritten = format!("{run}{extra}");
        let later = log(&[
            exit_line(7, SECRET, &vouch(run)),
            exit_line(7, SECRET, &vouch(&rewritten)),
        ]);
        assert_eq!(ownership_note(&rewritten, &later, "7-0"), Some(NOT_ITS_OWN));
    }

    #[test]
    fn the_first_processs_hook_lines_are_noted() {
        let key = sha256_hex(SECRET.as_bytes());
        let start = format!("{KEY_LINE}7 key {key}\n");
        assert!(hook_notes(&start).is_empty());
        let rewired = format!("{start}test ... ok{REWIRED_LINE}7 write's cell ledger\n");
        assert_eq!(hook_notes(&rewired), vec![REWIRED]);
        let lie = format!("{start}{LIE_LINE}7 calc.ops.Blank compared equal to 0.0 and to 1.0\n");
        assert_eq!(hook_notes(&lie), vec![LIE.to_string()]);
        assert_eq!(
            hook_notes(&format!("{rewired}{LIE_LINE}7 x\n")),
            vec![REWIRED, LIE]
        );
        // Each written module named, once; another process's not.
        let written = format!(
            "{start}{WRITTEN_LINE}7 calc/_share.py\n{WRITTEN_LINE}7 calc/_share.py\n{WRITTEN_LINE}9 x.py\n"
        );
        assert_eq!(
            hook_notes(&written),
            vec![format!("{WRITTEN}: calc/_share.py")]
        );
        // Another process's line, or no key at all: not the command's process.
        assert!(hook_notes(&format!("{start}{REWIRED_LINE}9 x\n")).is_empty());
        assert!(hook_notes(&format!("{REWIRED_LINE}7 x\n")).is_empty());
    }
}
