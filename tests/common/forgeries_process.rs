//! The red-team passes against the test process itself (issue 34, passes 12 to 22): the process
//! replaced, a child rerunning the command on rewritten tests, the attacks on the ledger that
//! decides whose run the command's run is (`src/env/grading/ledger.rs`), and the grader's own
//! recorders rewired in place. Each forgery earned the full reward from an earlier form of the
//! grader.

use super::forgeries::{append, with_line_after, write_file};
use serde_json::Value;

/// Passes 12 to 22, on the unittest or the pytest task (`pytest`; their code goes into `calc`).
pub fn red_team_process_passes(pytest: bool) -> Vec<(&'static str, Vec<Value>)> {
    let mut out = vec![
        // The twelfth pass: the test process replaced by a fresh run of the same command,
        // its tests rewritten first (in place, or in a copy the new run works in).
        (
            "tamper: the test process re-executed after the tests were rewritten on disk",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/reexec_rewritten_tests.py"),
            )],
        ),
        (
            "tamper: the test process re-executed in a copy of the workspace with rewritten tests",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/reexec_in_a_copy.py"),
            )],
        ),
        // The thirteenth pass: the same rewritten tests run by a child process, whose run is
        // taken for the command's own.
        (
            "tamper: a child process reruns the command on rewritten tests and the parent leaves with its status",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/child_rerun_of_rewritten_tests.py"),
            )],
        ),
        // The fourteenth: that child started without the lineage mark in its environment, so
        // that it believes itself the command's first process (the ledger decides it now).
        (
            "tamper: the child rerun started with the grader's lineage mark taken out of its environment",
            vec![append(
                "calc/ops.py",
                &with_line_after(
                    include_str!("../fixtures/forgeries/child_rerun_of_rewritten_tests.py"),
                    "    env[\"CALC_SECOND\"] = \"1\"\n",
                    "    env.pop(\"SWERVE_GRADER_FIRST_PROCESS\", None)\n",
                ),
            )],
        ),
    ];
    out.extend(red_team_ledger_passes());
    out.extend(red_team_hook_passes(pytest));
    out
}

/// Passes 22, 23 and 26: the grader's own recorders and ledger changed or called in place, which
/// the audit hook's ledger, seal and provenance checks (`grader_sitecustomize.py`, 5) now hold
/// out of reach.
fn red_team_hook_passes(pytest: bool) -> Vec<(&'static str, Vec<Value>)> {
    // The twenty-third: the results file rewritten by a thread that runs after the tests, and
    // the ledger's own counters (reached through its closure, every name spelled backwards)
    // set to match before it vouched for them; the log made to agree. The counts, hashes and
    // secret live in the audit hook now, which no code in the process reaches.
    let mut out = vec![if pytest {
        (
            "tamper: the results rewritten after the tests, the ledger's counters edited to match",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/ledger_counters_edited_pytest.py"),
            )],
        )
    } else {
        (
            "tamper: the results rewritten after the tests, the ledger's counters edited to match",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/ledger_counters_edited_unittest.py"),
            )],
        )
    }];
    // The twenty-second: a closure cell of the grader's recorders (unittest's result hooks; the
    // pytest plugin's writer, reached through the assertion rewriter on sys.meta_path) swapped
    // for a relay that marks the failing tests passed before the ledger counts the line, the log
    // made to agree (the result's stream, the terminal reporter's stats). The grader's code is
    // sealed as installed and compared at every audited event; reaching a function's cells,
    // globals or the import system's tables is flagged.
    out.push(if pytest {
        (
            "tamper: the pytest plugin's ledger cell swapped for a relay that rewrites records",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/closure_cell_relay_pytest.py"),
            )],
        )
    } else {
        (
            "tamper: the unittest recorders' write cell swapped for a relay that rewrites records",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/closure_cell_relay_unittest.py"),
            )],
        )
    });
    // The twenty-sixth: the unittest recorders' sealed `write` called directly with a pass for
    // the running test (reached through `inspect.getclosurevars`), the test then renamed so
    // that its real record went elsewhere; on pytest, the plugin's tables of outcomes and calls
    // edited from a finalizer of the failing test. A record that could help a test must now
    // come from the framework's own frames, for the test they run, with the status and call
    // the audit hook itself saw (`grader_provenance.py`).
    out.push(if pytest {
        (
            "tamper: the pytest plugin's outcome and call tables edited before the teardown record",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/outcome_table_edited_pytest.py"),
            )],
        )
    } else {
        (
            "tamper: the unittest recorders' write called with a pass, the failing test renamed",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/recorder_write_called_directly_unittest.py"),
            )],
        )
    });
    out.extend(red_team_value_passes(pytest));
    out
}

/// Passes 29 to 32: values that lie, caught where unittest compares them
/// (`grader_values.py`), and a module written while the tests run.
fn red_team_value_passes(pytest: bool) -> Vec<(&'static str, Vec<Value>)> {
    let mut out = Vec::new();
    // The twenty-ninth: values that lie however their equality is spelled (ten forgeries that
    // each found a way past the flags). A value the workspace defines that passed an equality
    // assertion is compared with values a truthful one is not equal to (`grader_values.py`);
    // this one reads both operands, which no flag rule catches.
    out.push((
        "tamper: a value whose equality reads both operands with an infinite tolerance",
        vec![append(
            "calc/ops.py",
            include_str!("../fixtures/forgeries/lying_value_reads_both_operands.py"),
        )],
    ));
    // The thirtieth: the lie carried by a standard-library value (a UserString holding a liar;
    // an email Charset, equal to the expected number's text). Every value but the built-in ones
    // is probed, against more values (an offset drawn per process, the number as text).
    out.extend([
        (
            "tamper: a UserString whose data is a workspace liar",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/library_value_carrying_a_liar.py"),
            )],
        ),
        (
            "tamper: an email Charset equal to the expected number's text",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/library_value_equal_to_its_text.py"),
            )],
        ),
    ]);
    // The thirty-first: a value that settles on the first value it is compared with (the
    // test's, before the probe); one within a narrow tolerance whose class claims the owned
    // test module. Probed before the assertion too, in a drawn order, with a tiny drawn step,
    // whoever claims the type.
    out.extend([
        (
            "a value equal only to the first value it is compared with",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/lying_value_settles_on_first.py"),
            )],
        ),
        (
            "tamper: a value equal within a narrow tolerance, its class claiming the test module",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/lying_value_narrow_tolerance.py"),
            )],
        ),
    ]);
    out.extend(red_team_thirty_second_pass(pytest));
    out
}

/// The thirty-second: a lying module written and imported while the tests run (out of the
/// flags' sight: the audit hook names a module run from a file written during the run); a class
/// whose metaclass claims `float`; a mock told to agree; a number equal only to the expected.
/// The thirty-third: the module out of the watched folders, a float lying in its conversion.
fn red_team_thirty_second_pass(pytest: bool) -> Vec<(&'static str, Vec<Value>)> {
    let forgery = |name, text: &str| (name, vec![append("calc/ops.py", text)]);
    if pytest {
        return vec![
            forgery(
                "tamper: a lying module written and imported while the tests run",
                include_str!("../fixtures/forgeries/written_module_pytest.py"),
            ),
            // The thirty-third: that module in a folder made during the run, or in a zip
            // archive, put on the package's `__path__`.
            forgery(
                "tamper: a lying module written into a folder made during the run",
                include_str!("../fixtures/forgeries/module_in_a_made_folder_pytest.py"),
            ),
            forgery(
                "tamper: a lying module written into a zip archive on the package's path",
                include_str!("../fixtures/forgeries/module_in_a_zip_pytest.py"),
            ),
        ];
    }
    vec![
        // The thirty-third: a float whose `__float__` answers the expected number.
        forgery(
            "tamper: a float whose own conversion answers the expected number",
            include_str!("../fixtures/forgeries/float_conversion_lies.py"),
        ),
        forgery(
            "tamper: a lying value whose metaclass claims a built-in type",
            include_str!("../fixtures/forgeries/metaclass_claims_built_in.py"),
        ),
        forgery(
            "tamper: a MagicMock told to compare equal",
            include_str!("../fixtures/forgeries/mock_told_to_agree.py"),
        ),
        forgery(
            "tamper: a number equal only to the expected value, its own number another",
            include_str!("../fixtures/forgeries/equal_only_to_expected.py"),
        ),
    ]
}

/// Passes 15 to 20: the ledger attacked from inside the test process.
fn red_team_ledger_passes() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        // The fifteenth: the child's lines copied into the test process's own ledger (then a
        // public function of the grader's module), which vouched for them at its exit. The
        // ledger is a closure now, and naming the grader's modules is flagged.
        (
            "the child's run laundered through the test process's own ledger",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/child_run_vouched_through_the_ledger.py"),
            )],
        ),
        // The sixteenth: a protocol-0 pickle (text no scan read as code) whose payload filters
        // the log and, once the ledger had put its secret into the results file at exit,
        // rewrote the file with a matching exit record. The secret leaves on the log now.
        (
            "the record rewritten after exit with the ledger's secret, from a pickle",
            vec![
                append(
                    "calc/ops.py",
                    include_str!("../fixtures/forgeries/pickled_record_rewrite.py"),
                ),
                write_file(
                    "calc/rounding.dat",
                    include_str!("../fixtures/forgeries/pickled_record_rewrite.dat"),
                ),
            ],
        ),
        // The seventeenth: the ledger's log descriptor closed and reopened on a file (the
        // lowest free number), so the exit line and its secret landed there; a generator's
        // `finally` at teardown then rewrote the record and printed a matching exit line. The
        // ledger prints nothing to a descriptor that is no longer the log it duplicated.
        (
            "the ledger's log descriptor swapped for a file, the exit line forged at teardown",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/log_descriptor_swapped.py"),
            )],
        ),
        // The eighteenth: `os.write` replaced, which the ledger looked up at exit, so the hook
        // got the exit line and printed a forged one. The ledger takes every function it calls
        // as it opens, and replacing `os`'s functions is flagged (`sys-write`).
        (
            "os.write replaced, the ledger's exit line caught and forged by the hook",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/os_write_replaced.py"),
            )],
        ),
        // The nineteenth: `json.JSONEncoder` replaced, which the ledger's `json.dumps` looked up
        // at exit, so the encoder got the secret and returned a forged exit line. The exit line
        // is formatted by hand now, and any standard-library module written is flagged.
        (
            "json's encoder replaced, the ledger's exit line forged by the encoder",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/json_encoder_replaced.py"),
            )],
        ),
        // The twentieth: json's encoder class patched through `type(...)`, so each record was
        // rewritten before the ledger hashed it, and the log's stream patched on its instance.
        // The ledger encodes records itself, through json's C encoder alone, and an attribute
        // stored on what a call returns is flagged (`indirect-write`).
        (
            "records rewritten by a patched encoder class, the log by a patched stream instance",
            vec![append(
                "calc/ops.py",
                include_str!("../fixtures/forgeries/record_encoder_and_stream_patched.py"),
            )],
        ),
    ]
}
