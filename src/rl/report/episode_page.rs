//! One episode's page: the suspicious flag first, then its facts, its conversation, the
//! grading verdict with the test log, the agent's diff, and its tokens by action mask.

use super::conversation::conversation_html;
use super::html::{escape, long_text, long_text_with, page, thousands};
use super::load::EpisodeLine;
use super::run_tokenizer::RunTokenizer;
use super::token_spans::tokens_html;

/// Where an episode's page sits: its set's title and its neighbours' pages.
pub struct EpisodePlace<'a> {
    pub set_title: &'a str,
    pub previous: Option<&'a str>,
    pub next: Option<&'a str>,
}

/// The episode's page (a whole HTML document).
pub fn episode_page(
    line: &EpisodeLine,
    place: &EpisodePlace<'_>,
    tokenizer: &RunTokenizer,
) -> String {
    let title = format!("{} #{}", line.task, line.sample);
    let mut body = crumbs(&title, place);
    let (outcome, class) = if line.resolved {
        ("resolved", "resolved")
    } else {
        ("not resolved", "unresolved")
    };
    body.push_str(&format!(
        "<h1>{} <span class=\"meta\">sample {}</span><span class=\"badge {class}\">{outcome}</span>\
         <span class=\"badge\">{}</span></h1>\n",
        escape(&line.task),
        line.sample,
        escape(&line.finish)
    ));
    body.push_str(&suspicious_html(line));
    if let Some(error) = &line.error {
        body.push_str(&format!(
            "<div class=\"warning\"><b>The infrastructure failed</b> (never trained on): {}</div>\n",
            escape(error)
        ));
    }
    body.push_str(&facts_html(line));
    body.push_str("<h2 id=\"conversation\">Conversation</h2>\n");
    if line.messages.is_empty() {
        body.push_str("<p class=\"note\">No messages: the episode kept no trajectory.</p>\n");
    }
    body.push_str(&conversation_html(&line.messages));
    body.push_str("<h2 id=\"grading\">Grading</h2>\n");
    body.push_str(&grading_html(line));
    body.push_str("<h2 id=\"patch\">The agent's diff</h2>\n");
    body.push_str(&patch_html(line));
    body.push_str("<h2 id=\"tokens\">Tokens by action mask</h2>\n<details><summary>the token form, as the trainer reads it</summary>\n");
    body.push_str(&tokens_html(
        &line.tokens,
        &line.action_mask,
        tokenizer.tokenizer.as_ref(),
        &tokenizer.origin,
    ));
    body.push_str("\n</details>\n");
    page(&title, &body)
}

fn crumbs(title: &str, place: &EpisodePlace<'_>) -> String {
    let link = |href: Option<&str>, text: &str| match href {
        Some(h) => format!(" · <a href=\"{}\">{text}</a>", escape(h)),
        None => String::new(),
    };
    format!(
        "<nav class=\"crumbs\"><a href=\"../index.html\">report</a> › <a href=\"index.html\">{}</a> › {}{}{}</nav>\n",
        escape(place.set_title),
        escape(title),
        link(place.previous, "← previous episode"),
        link(place.next, "next episode →")
    )
}

/// The `suspicious` flag, prominent: a red box with the reasons.
fn suspicious_html(line: &EpisodeLine) -> String {
    if !line.suspicious {
        return String::new();
    }
    let reasons: String = line
        .suspicious_reasons
        .iter()
        .map(|r| format!("<li>{}</li>", escape(r)))
        .collect();
    format!(
        "<div class=\"suspicious\">⚠ SUSPICIOUS: the agent's change looks like an attempt at the \
         reward rather than the task<ul>{reasons}</ul></div>\n"
    )
}

fn facts_html(line: &EpisodeLine) -> String {
    let mut rows = vec![
        ("reward", format!("{:.4}", line.reward)),
        ("resolved", line.resolved.to_string()),
        ("finish", line.finish.clone()),
        ("turns", line.turns.to_string()),
        ("format errors", line.format_errors.to_string()),
    ];
    if let Some(a) = line.advantage {
        rows.push(("advantage", format!("{a:.4}")));
    } else if line.kept.is_some() {
        rows.push(("advantage", "none (dropped)".into()));
    }
    if let Some(kept) = line.kept {
        rows.push(("trained on", kept.to_string()));
    }
    if !line.tokens.is_empty() {
        let trained = line.action_mask.iter().filter(|&&m| m == 1).count();
        rows.push((
            "tokens",
            format!(
                "{} ({} trained)",
                thousands(line.tokens.len()),
                thousands(trained)
            ),
        ));
    }
    if let Some(seed) = line.seed {
        rows.push(("seed", seed.to_string()));
    }
    if let Some((first, last)) = line.weight_version {
        rows.push(("weight versions", format!("{first} … {last}")));
    }
    if line.infra_retries > 0 {
        rows.push(("infrastructure retries", line.infra_retries.to_string()));
    }
    rows.push(("read from", line.place.clone()));
    let items: String = rows
        .iter()
        .map(|(k, v)| format!("<div><dt>{k}</dt><dd>{}</dd></div>", escape(v)))
        .collect();
    format!("<dl class=\"facts\">{items}</dl>\n")
}

/// The verdict, why the tests did not run, and the test log's tail as the trajectory keeps it.
fn grading_html(line: &EpisodeLine) -> String {
    let Some(grading) = &line.grading else {
        return if line.finish == "submitted" {
            format!(
                "<p>Graded in place by the task's own command (resolved: {}); the trajectory keeps no test log.</p>\n",
                line.resolved
            )
        } else {
            format!(
                "<p>Not graded: only a submitted episode is graded, and this one ended with {}.</p>\n",
                escape(&line.finish)
            )
        };
    };
    let mut html = String::new();
    if let Some(v) = &grading.verdict {
        let class = if v.resolved { "resolved" } else { "unresolved" };
        html.push_str(&format!(
            "<p>Verdict: <b class=\"{class}\">{}</b> · {} tests passed · {} failed</p>\n",
            if v.resolved {
                "resolved"
            } else {
                "not resolved"
            },
            v.passed,
            v.failed
        ));
        for why in &v.tampered {
            html.push_str(&format!(
                "<p class=\"unresolved\">⚠ TAMPERED: {}</p>\n",
                escape(why)
            ));
        }
        for why in &v.problems {
            html.push_str(&format!("<p class=\"note\">{}</p>\n", escape(why)));
        }
        if !v.not_passing.is_empty() {
            let rows: String = v
                .not_passing
                .iter()
                .map(|(test, status)| {
                    format!(
                        "<tr><td><code>{}</code></td><td class=\"unresolved\">{}</td></tr>",
                        escape(test),
                        escape(status)
                    )
                })
                .collect();
            html.push_str(&format!("<table><tr><th>FAIL_TO_PASS / PASS_TO_PASS test not passing</th><th>status</th></tr>{rows}</table>\n"));
        }
    }
    if let Some(failure) = &grading.failure {
        html.push_str(&format!(
            "<div class=\"warning\"><b>The tests did not run:</b> {}</div>\n",
            escape(failure)
        ));
    }
    if let Some(e) = &grading.cleanup_error {
        html.push_str(&format!(
            "<p class=\"note\">A cleanup after the verdict failed: {}</p>\n",
            escape(e)
        ));
    }
    if grading.log_tail.is_empty() {
        html.push_str("<p class=\"note\">No test log.</p>\n");
    } else {
        html.push_str("<h3>Test log (its end, as the trajectory keeps it)</h3>\n");
        html.push_str(&long_text(&grading.log_tail, "log"));
        html.push('\n');
    }
    html
}

fn patch_html(line: &EpisodeLine) -> String {
    let mut html = match line.patch.as_deref() {
        None => "<p class=\"note\">No diff recorded (a task without a repository, or the change could not be read: see the grading).</p>\n".to_string(),
        Some("") => "<p>The agent changed nothing that is graded.</p>\n".to_string(),
        Some(patch) => long_text_with(patch, "diff", &colour_diff) + "\n",
    };
    if !line.patch_dropped.is_empty() {
        let rows: String = line
            .patch_dropped
            .iter()
            .map(|(path, why)| {
                format!(
                    "<tr><td><code>{}</code></td><td>{}</td></tr>",
                    escape(path),
                    escape(why)
                )
            })
            .collect();
        html.push_str(&format!("<h3>Left out of the diff</h3><table><tr><th>file</th><th>why</th></tr>{rows}</table>\n"));
    }
    html
}

/// A unified diff's lines escaped and coloured: file headers, hunk headers, additions, deletions.
pub fn colour_diff(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for line in text.split_inclusive('\n') {
        let class = if line.starts_with("diff --git")
            || line.starts_with("+++ ")
            || line.starts_with("--- ")
            || line.starts_with("index ")
        {
            Some("file")
        } else if line.starts_with("@@") {
            Some("hunk")
        } else if line.starts_with('+') {
            Some("add")
        } else if line.starts_with('-') {
            Some("del")
        } else {
            None
        };
        match class {
            Some(class) => {
                let (body, newline) = match line.strip_suffix('\n') {
                    Some(body) => (body, "\n"),
                    None => (line, ""),
                };
                out.push_str(&format!(
                    "<span class=\"{class}\">{}</span>{newline}",
                    escape(body)
                ));
            }
            None => out.push_str(&escape(line)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::episode::GradingRecord;
    use crate::env::task::Verdict;
    use serde_json::json;

    #[test]
    fn diff_lines_are_coloured_by_their_sign_and_escaped() {
        let diff = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-if a < b:\n+if a <= b:\n context\n";
        assert_eq!(
            colour_diff(diff),
            "<span class=\"file\">diff --git a/x.py b/x.py</span>\n<span class=\"file\">--- a/x.py</span>\n\
             <span class=\"file\">+++ b/x.py</span>\n<span class=\"hunk\">@@ -1 +1 @@</span>\n\
             <span class=\"del\">-if a &lt; b:</span>\n<span class=\"add\">+if a &lt;= b:</span>\n context\n"
        );
    }

    fn episode() -> EpisodeLine {
        EpisodeLine {
            place: "/r/trajectories.jsonl:1".into(),
            task: "bug-<1>".into(),
            sample: 2,
            reward: 0.8,
            resolved: true,
            turns: 2,
            finish: "submitted".into(),
            patch: Some("+print('<pwned>')\n".into()),
            patch_dropped: vec![("x.pyc".into(), "compiled".into())],
            suspicious: true,
            suspicious_reasons: vec![
                "touches conftest <hook>".into(),
                "pkg/io.py:3: stream-replace: sys.stdout = Tee(\"<b>\", sys.stdout)".into(),
            ],
            grading: Some(GradingRecord {
                verdict: Some(Verdict {
                    resolved: false,
                    passed: 3,
                    failed: 1,
                    not_passing: vec![("test_a".into(), "failed".into())],
                    tampered: vec!["grader canary <x> reported passed".into()],
                    problems: vec![],
                }),
                failure: None,
                log_tail: "FAILED test_a </details>".into(),
                cleanup_error: None,
            }),
            tokens: vec![1, 2],
            action_mask: vec![0, 1],
            messages: vec![json!({"role": "user", "content": "fix"})],
            advantage: Some(0.5),
            kept: Some(true),
            ..EpisodeLine::default()
        }
    }

    #[test]
    fn the_page_puts_the_flag_first_then_the_sections_in_order() {
        let place = EpisodePlace {
            set_title: "iteration 3",
            previous: None,
            next: Some("episode-000002.html"),
        };
        let tokenizer = RunTokenizer {
            tokenizer: None,
            origin: "no tokenizer found".into(),
        };
        let html = episode_page(&episode(), &place, &tokenizer);
        let order = [
            "<title>bug-&lt;1&gt; #2</title>",
            "<a href=\"index.html\">iteration 3</a>",
            "<a href=\"episode-000002.html\">next episode →</a>",
            "⚠ SUSPICIOUS",
            "<li>touches conftest &lt;hook&gt;</li>",
            "<li>pkg/io.py:3: stream-replace: sys.stdout = Tee(&quot;&lt;b&gt;&quot;, sys.stdout)</li>",
            "<dt>advantage</dt><dd>0.5000</dd>",
            "Conversation",
            "Verdict: <b class=\"unresolved\">not resolved</b> · 3 tests passed · 1 failed",
            "<code>test_a</code>",
            "FAILED test_a &lt;/details&gt;",
            "<span class=\"add\">+print(&#39;&lt;pwned&gt;&#39;)</span>",
            "<code>x.pyc</code>",
            "Tokens by action mask",
            "no tokenizer found",
        ];
        let mut from = 0;
        for part in order {
            let at = html[from..]
                .find(part)
                .unwrap_or_else(|| panic!("{part} not after {from} in\n{html}"));
            from += at + part.len();
        }
        assert!(!html.contains("<pwned>"));
        assert!(html.contains("⚠ TAMPERED: grader canary &lt;x&gt; reported passed"));
    }

    #[test]
    fn episodes_without_a_grading_record_say_why() {
        let mut line = EpisodeLine {
            grading: None,
            patch: None,
            ..episode()
        };
        let place = EpisodePlace {
            set_title: "rollout",
            previous: None,
            next: None,
        };
        let tokenizer = RunTokenizer {
            tokenizer: None,
            origin: String::new(),
        };
        let html = episode_page(&line, &place, &tokenizer);
        assert!(html.contains("Graded in place by the task's own command (resolved: true)"));
        line.finish = "max_turns".into();
        let html = episode_page(&line, &place, &tokenizer);
        assert!(html.contains(
            "Not graded: only a submitted episode is graded, and this one ended with max_turns."
        ));
        assert!(html.contains("No diff recorded"));
    }
}
