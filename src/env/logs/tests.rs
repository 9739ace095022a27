//! Each parser on a log shaped like its runner's real output.

use super::*;
use TestStatus::*;

fn status(map: &BTreeMap<String, TestStatus>, id: &str) -> Option<TestStatus> {
    map.get(canonical_id(id).as_ref()).copied()
}

const PYTEST_RA: &str = "\
============================= test session starts ==============================
collected 7 items

tests/test_utils.py ..F.sx.                                                [100%]

=================================== FAILURES ===================================
=========================== short test summary info ============================
PASSED tests/test_utils.py::test_super_len_io_streams
PASSED tests/test_utils.py::TestGuessFilename::test_guess_filename_valid[value0-bytes]
PASSED tests/test_utils.py::test_parse_header_links[<http:/.../front.jpeg>; rel=front; type=\"image/jpeg\"-expected0]
FAILED tests/test_utils.py::test_to_native_string[value0-expected0] - AssertionError: assert 'a' == 'b'
ERROR tests/test_utils.py::test_fixture_broken - fixture 'missing' not found
SKIPPED [1] tests/test_utils.py:412: requires network
XFAIL tests/test_utils.py::test_known_bug - reason: see #123
XPASS tests/test_utils.py::test_fixed_already
ERROR tests/test_broken.py
============== 1 failed, 3 passed, 1 skipped, 1 xfailed, 2 errors in 0.52s ==============
";

#[test]
fn pytest_summary_lines() {
    let m = parse_log(LogParser::Pytest, PYTEST_RA);
    assert_eq!(
        status(&m, "tests/test_utils.py::test_super_len_io_streams"),
        Some(Passed)
    );
    assert_eq!(
        status(&m, "tests/test_utils.py::test_parse_header_links[<http:/.../front.jpeg>; rel=front; type=\"image/jpeg\"-expected0]"),
        Some(Passed)
    );
    assert_eq!(
        status(
            &m,
            "tests/test_utils.py::test_to_native_string[value0-expected0]"
        ),
        Some(Failed)
    );
    assert_eq!(
        status(&m, "tests/test_utils.py::test_fixture_broken"),
        Some(Error)
    );
    assert_eq!(status(&m, "tests/test_utils.py:412"), Some(Skipped));
    assert_eq!(
        status(&m, "tests/test_utils.py::test_known_bug"),
        Some(XFail)
    );
    assert_eq!(
        status(&m, "tests/test_utils.py::test_fixed_already"),
        Some(XPass)
    );
    assert_eq!(status(&m, "tests/test_broken.py"), Some(Error));
    assert_eq!(m.len(), 9, "{m:?}");
    // SWE-bench's lists cut an id with spaces at its first space.
    assert_eq!(
        lookup(
            &m,
            "tests/test_utils.py::test_parse_header_links[<http:/.../front.jpeg>;"
        ),
        Some(Passed)
    );
    assert_eq!(lookup(&m, "tests/test_utils.py::test_nothing"), None);
}

#[test]
fn pytest_verbose_and_coloured_lines() {
    let log = "\
\x1b[1m============================= test session starts ==============================\x1b[0m
astropy/io/fits/tests/test_header.py::TestHeaderFunctions::test_card_constructor_default_args PASSED [ 33%]
astropy/io/fits/tests/test_header.py::TestHeaderFunctions::test_long_string_value[a b] \x1b[31mFAILED\x1b[0m [ 66%]
astropy/io/fits/tests/test_header.py::test_skip SKIPPED
\x1b[32mPASSED\x1b[0m astropy/io/fits/tests/test_header.py::test_shallow_copy
";
    let m = parse_log(LogParser::PytestV2, log);
    assert_eq!(
        status(&m, "astropy/io/fits/tests/test_header.py::TestHeaderFunctions::test_card_constructor_default_args"),
        Some(Passed)
    );
    assert_eq!(
        status(&m, "astropy/io/fits/tests/test_header.py::TestHeaderFunctions::test_long_string_value[a b]"),
        Some(Failed)
    );
    assert_eq!(
        status(&m, "astropy/io/fits/tests/test_header.py::test_skip"),
        Some(Skipped)
    );
    assert_eq!(
        status(
            &m,
            "astropy/io/fits/tests/test_header.py::test_shallow_copy"
        ),
        Some(Passed)
    );
}

#[test]
fn pytest_options_and_matplotlib_forms() {
    let log = "PASSED tests/test_requests.py::test_path[/tmp/pytest-of-root/pytest-0/test0/a.txt]\nFAILED lib/x.py::test_press[MouseButton.LEFT] - boom\n";
    let m = parse_log(LogParser::PytestOptions, log);
    assert_eq!(
        status(&m, "tests/test_requests.py::test_path[/a.txt]"),
        Some(Passed)
    );
    let m = parse_log(LogParser::Matplotlib, log);
    assert_eq!(status(&m, "lib/x.py::test_press[1]"), Some(Failed));
}

const DJANGO_LOG: &str = "\
Testing against Django installed in '/testbed/django'
Importing application auth_tests
Skipping setup of unused database(s): other.
Operations to perform:
  Apply all migrations: admin, auth
Running migrations:
  Applying admin.0001_initial... OK
System check identified no issues (0 silenced).
test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests) ... ok
test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests) ... FAIL
test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest) ... ERROR
test_validate_property (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)
Validation should fail when the user attribute is too similar. ... ok
test_mysql_only (auth_tests.test_validators.OtherTests) ... skipped 'MySQL specific'
test_known (auth_tests.test_validators.OtherTests) ... expected failure
test_prints (auth_tests.test_validators.OtherTests) ... Some output the test printed
more of it
ok
test_new_form (auth_tests.test_forms.T.test_new_form) ... ok

======================================================================
FAIL: test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)
----------------------------------------------------------------------
Traceback (most recent call last):
  File \"/testbed/tests/auth_tests/test_validators.py\", line 240, in test_unicode_validator
AssertionError: ValidationError not raised

----------------------------------------------------------------------
Ran 8 tests in 0.012s

FAILED (failures=1, errors=1, skipped=1, expected failures=1)
";

#[test]
fn django_verbose_runner() {
    let m = parse_log(LogParser::Django, DJANGO_LOG);
    let t = "(auth_tests.test_validators.UsernameValidatorsTests)";
    assert_eq!(
        status(&m, &format!("test_ascii_validator {t}")),
        Some(Passed)
    );
    assert_eq!(
        status(&m, &format!("test_unicode_validator {t}")),
        Some(Failed)
    );
    assert_eq!(
        status(
            &m,
            "test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)"
        ),
        Some(Error)
    );
    // A docstring's first line, and the test's own id above it.
    assert_eq!(
        status(
            &m,
            "Validation should fail when the user attribute is too similar."
        ),
        Some(Passed)
    );
    assert_eq!(
        status(&m, "test_validate_property (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)"),
        Some(Passed)
    );
    assert_eq!(
        status(
            &m,
            "test_mysql_only (auth_tests.test_validators.OtherTests)"
        ),
        Some(Skipped)
    );
    assert_eq!(
        status(&m, "test_known (auth_tests.test_validators.OtherTests)"),
        Some(XFail)
    );
    assert_eq!(
        status(&m, "test_prints (auth_tests.test_validators.OtherTests)"),
        Some(Passed)
    );
    // Python 3.11's form is found by the older one and the other way round.
    assert_eq!(
        lookup(&m, "test_new_form (auth_tests.test_forms.T)"),
        Some(Passed)
    );
    assert_eq!(
        lookup(&m, "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests.test_ascii_validator)"),
        Some(Passed)
    );
    assert!(!m.keys().any(|k| k.contains("Applying")), "{m:?}");
}

#[test]
fn unittest_verbose_runner() {
    let log = "\
test_exact_multiple (tests.test_pager.PagerTests.test_exact_multiple) ... ok
test_last_page (tests.test_pager.PagerTests.test_last_page) ... FAIL
test_slow (tests.test_pager.PagerTests.test_slow) ... skipped 'slow'
test_lucky (tests.test_pager.PagerTests.test_lucky) ... unexpected success
tests.test_missing (unittest.loader._FailedTest.tests.test_missing) ... ERROR

======================================================================
ERROR: tests.test_missing (unittest.loader._FailedTest.tests.test_missing)
----------------------------------------------------------------------
ImportError: Failed to import test module: tests.test_missing
";
    let m = parse_log(LogParser::Unittest, log);
    assert_eq!(
        status(
            &m,
            "test_exact_multiple (tests.test_pager.PagerTests.test_exact_multiple)"
        ),
        Some(Passed)
    );
    assert_eq!(
        status(
            &m,
            "test_last_page (tests.test_pager.PagerTests.test_last_page)"
        ),
        Some(Failed)
    );
    assert_eq!(
        status(&m, "test_slow (tests.test_pager.PagerTests.test_slow)"),
        Some(Skipped)
    );
    assert_eq!(
        status(&m, "test_lucky (tests.test_pager.PagerTests.test_lucky)"),
        Some(XPass)
    );
    assert_eq!(
        status(
            &m,
            "tests.test_missing (unittest.loader._FailedTest.tests.test_missing)"
        ),
        Some(Error)
    );
    assert_eq!(m.len(), 5, "{m:?}");
}

#[test]
fn sympy_bin_test() {
    let log = "\
============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]
architecture:       64-bit
random seed:        83473846
hash randomization: on (PYTHONHASHSEED=2349062104)

sympy/core/tests/test_basic.py[4] 
test__aresame ok
test_structure ok
test_immutable F
test_slow_thing Slow w
test_expected f                                                           [FAIL]

sympy/printing/tests/test_str.py[1] 
test_printmethod E                                                          [FAIL]

________________________________________________________________________________
_______________ sympy/core/tests/test_basic.py:test_immutable ________________
Traceback (most recent call last):
AssertionError
________________________________________________________________________________
_______________ sympy/core/tests/test_other.py:test_unseen ___________________
Traceback (most recent call last):

=== tests finished: 2 passed, 1 failed, 1 skipped, 1 expected to fail, 1 exceptions, in 0.12 seconds ===
DO *NOT* COMMIT!
";
    let m = parse_log(LogParser::Sympy, log);
    assert_eq!(status(&m, "test__aresame"), Some(Passed));
    assert_eq!(status(&m, "test_structure"), Some(Passed));
    assert_eq!(status(&m, "test_immutable"), Some(Failed));
    assert_eq!(status(&m, "test_slow_thing"), Some(Skipped));
    assert_eq!(status(&m, "test_expected"), Some(XFail));
    assert_eq!(status(&m, "test_printmethod"), Some(Error));
    assert_eq!(
        status(&m, "sympy/core/tests/test_other.py:test_unseen"),
        Some(Failed)
    );
    assert_eq!(
        status(&m, "sympy/core/tests/test_basic.py:test_immutable"),
        None
    );
}

#[test]
fn parser_names() {
    for (name, want) in [
        ("pytest", LogParser::Pytest),
        ("parse_log_pytest", LogParser::Pytest),
        ("parse_log_pytest_options", LogParser::PytestOptions),
        ("parse_log_pytest_v2", LogParser::PytestV2),
        ("parse_log_django", LogParser::Django),
        ("parse_log_sympy", LogParser::Sympy),
        ("parse_log_seaborn", LogParser::Seaborn),
        ("parse_log_matplotlib", LogParser::Matplotlib),
        ("parse_log_astroid", LogParser::Pytest),
        ("parse_log_astropy", LogParser::PytestV2),
        ("parse_log_requests", LogParser::PytestOptions),
        ("unittest", LogParser::Unittest),
    ] {
        assert_eq!(name.parse::<LogParser>(), Ok(want), "{name}");
        assert_eq!(want.to_string().parse::<LogParser>(), Ok(want));
    }
    let err = "parse_log_gotest".parse::<LogParser>().unwrap_err();
    assert!(err.contains("\"parse_log_gotest\""), "{err}");
}

#[test]
fn a_test_reported_two_ways_is_conflicting_whatever_the_order_or_form() {
    // A short-form "ok" printed at import, the runner's long-form FAIL after it.
    let log = "test_a (m.T) ... ok\ntest_a (m.T.test_a) ... FAIL\n";
    assert_eq!(
        lookup(&parse_log(LogParser::Unittest, log), "test_a (m.T)"),
        Some(Conflict)
    );
    // A PASSED line printed after pytest's summary (a finaliser).
    let log = "FAILED t.py::test_a - assert\n===== 1 failed in 0.1s =====\nPASSED t.py::test_a\n";
    assert_eq!(
        lookup(&parse_log(LogParser::Pytest, log), "t.py::test_a"),
        Some(Conflict)
    );
    let log = "test_a ok\ntest_a F\n";
    assert_eq!(
        lookup(&parse_log(LogParser::Sympy, log), "test_a"),
        Some(Conflict)
    );
    assert!(!Conflict.is_pass() && Conflict.is_fail() && !XFail.is_pass() && !XPass.is_pass());
}
