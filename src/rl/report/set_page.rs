//! A set's page (one `rl` iteration, or a rollout folder): its figures, then a row per task
//! with the group's episodes, each a link to its page showing its reward, turns, finish reason
//! and flags.
//!
//! ```text
//!   task     resolved  mean reward  episodes
//!   bug-3    2 / 4     0.41         [#0 0.80 · 3 turns · submitted] [#1 0.00 · 8 turns · max_turns ⚠] ...
//! ```

use super::html::{escape, page, thousands};
use super::load::{EpisodeLine, EpisodeSet};
use std::collections::BTreeMap;

/// What a set's page and the index need of an episode (the lines themselves are not kept).
#[derive(Clone, Debug)]
pub struct EpisodeSummary {
    pub task: String,
    pub sample: usize,
    pub reward: f64,
    pub resolved: bool,
    pub turns: usize,
    pub finish: String,
    pub format_errors: usize,
    pub suspicious: bool,
    pub advantage: Option<f64>,
    pub kept: Option<bool>,
    /// The episode's page, relative to the set's folder.
    pub page: String,
}

impl EpisodeSummary {
    pub fn of(line: &EpisodeLine, page: String) -> Self {
        Self {
            task: line.task.clone(),
            sample: line.sample,
            reward: line.reward,
            resolved: line.resolved,
            turns: line.turns,
            finish: line.finish.clone(),
            format_errors: line.format_errors,
            suspicious: line.suspicious,
            advantage: line.advantage,
            kept: line.kept,
            page,
        }
    }
}

/// A set's headline figures, computed from its episodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetFigures {
    pub episodes: usize,
    pub resolved: usize,
    pub mean_reward: f64,
    pub mean_turns: f64,
    pub format_errors: usize,
    pub suspicious: usize,
    /// Episodes per finish reason.
    pub finish: BTreeMap<String, usize>,
}

impl SetFigures {
    pub fn of(episodes: &[EpisodeSummary]) -> Self {
        let n = episodes.len().max(1) as f64;
        let mut finish = BTreeMap::new();
        for e in episodes {
            *finish.entry(e.finish.clone()).or_default() += 1;
        }
        Self {
            episodes: episodes.len(),
            resolved: episodes.iter().filter(|e| e.resolved).count(),
            mean_reward: episodes.iter().map(|e| e.reward).sum::<f64>() / n,
            mean_turns: episodes.iter().map(|e| e.turns as f64).sum::<f64>() / n,
            format_errors: episodes.iter().map(|e| e.format_errors).sum(),
            suspicious: episodes.iter().filter(|e| e.suspicious).count(),
            finish,
        }
    }

    pub fn finish_text(&self) -> String {
        self.finish
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How a set is named on the pages: `rollout`, or `iteration 3 (dapo)`.
pub fn set_title(set: &EpisodeSet) -> String {
    match set.iteration {
        None => set.name.clone(),
        Some(i) => match set.summary.as_ref().and_then(|s| s["phase"].as_str()) {
            Some(phase) => format!("iteration {i} ({phase})"),
            None => format!("iteration {i}"),
        },
    }
}

/// The set's page (a whole HTML document).
pub fn set_page(set: &EpisodeSet, episodes: &[EpisodeSummary]) -> String {
    let title = set_title(set);
    let figures = SetFigures::of(episodes);
    let mut body = format!(
        "<nav class=\"crumbs\"><a href=\"../index.html\">report</a> › {}</nav>\n<h1>{}</h1>\n\
         <p class=\"note\">From {}</p>\n",
        escape(&title),
        escape(&title),
        escape(&set.path.display().to_string())
    );
    body.push_str(&format!(
        "<table class=\"figures\"><tr><th>episodes</th><th>resolved</th><th>mean reward</th>\
         <th>mean turns</th><th>format errors</th><th>suspicious</th><th>finish</th></tr>\
         <tr><td class=\"num\">{}</td><td class=\"num\">{} ({:.1}%)</td><td class=\"num\">{:.3}</td>\
         <td class=\"num\">{:.2}</td><td class=\"num\">{}</td><td class=\"num{}\">{}</td><td>{}</td></tr></table>\n",
        thousands(figures.episodes),
        thousands(figures.resolved),
        100.0 * figures.resolved as f64 / figures.episodes.max(1) as f64,
        figures.mean_reward,
        figures.mean_turns,
        thousands(figures.format_errors),
        if figures.suspicious > 0 { " flag" } else { "" },
        thousands(figures.suspicious),
        escape(&figures.finish_text())
    ));
    body.push_str("<h2>Tasks</h2>\n<p class=\"note\">Each episode: sample, reward, turns, finish \
                   (⚠: suspicious; A: the group advantage where the run trained). Green: resolved.</p>\n");
    body.push_str(&task_table(episodes));
    page(&title, &body)
}

/// A row per task, in the order the tasks first appear.
fn task_table(episodes: &[EpisodeSummary]) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut groups: BTreeMap<&str, Vec<&EpisodeSummary>> = BTreeMap::new();
    for e in episodes {
        let group = groups.entry(e.task.as_str()).or_default();
        if group.is_empty() {
            order.push(&e.task);
        }
        group.push(e);
    }
    let mut html = String::from(
        "<table class=\"tasks\"><tr><th>task</th><th>resolved</th><th>mean reward</th><th>episodes</th></tr>\n",
    );
    for task in order {
        let group = &groups[task];
        let resolved = group.iter().filter(|e| e.resolved).count();
        let mean = group.iter().map(|e| e.reward).sum::<f64>() / group.len() as f64;
        let chips: String = group.iter().map(|e| episode_chip(e)).collect();
        html.push_str(&format!(
            "<tr><td><code>{}</code></td><td class=\"num {}\">{resolved} / {}</td><td class=\"num\">{mean:.3}</td>\
             <td><div class=\"episodes\">{chips}</div></td></tr>\n",
            escape(task),
            if resolved > 0 { "resolved" } else { "unresolved" },
            group.len()
        ));
    }
    html.push_str("</table>\n");
    html
}

fn episode_chip(e: &EpisodeSummary) -> String {
    let mut classes = vec!["episode"];
    if e.resolved {
        classes.push("resolved");
    }
    if e.finish == "error" {
        classes.push("error");
    }
    if e.suspicious {
        classes.push("suspicious-episode");
    }
    let mut text = format!(
        "#{} · {:.2} · {} turn{} · {}",
        e.sample,
        e.reward,
        e.turns,
        if e.turns == 1 { "" } else { "s" },
        e.finish
    );
    if e.format_errors > 0 {
        text.push_str(&format!(
            " · {} format error{}",
            e.format_errors,
            if e.format_errors == 1 { "" } else { "s" }
        ));
    }
    if let Some(a) = e.advantage {
        text.push_str(&format!(" · A {a:+.2}"));
    }
    if e.kept == Some(false) {
        text.push_str(" · not trained");
    }
    if e.suspicious {
        text.push_str(" ⚠");
    }
    format!(
        "<a class=\"{}\" href=\"{}\">{}</a>",
        classes.join(" "),
        escape(&e.page),
        escape(&text)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(task: &str, sample: usize, resolved: bool, finish: &str) -> EpisodeSummary {
        EpisodeSummary {
            task: task.into(),
            sample,
            reward: if resolved { 1.0 } else { 0.0 },
            resolved,
            turns: sample + 1,
            finish: finish.into(),
            format_errors: sample,
            suspicious: sample == 1,
            advantage: None,
            kept: None,
            page: format!("episode-{sample:06}.html"),
        }
    }

    #[test]
    fn figures_and_rows_come_from_the_episodes() {
        let episodes = vec![
            summary("b<2>", 0, true, "submitted"),
            summary("a", 0, false, "max_turns"),
            summary("b<2>", 1, false, "submitted"),
        ];
        let figures = SetFigures::of(&episodes);
        assert_eq!(
            (
                figures.episodes,
                figures.resolved,
                figures.format_errors,
                figures.suspicious
            ),
            (3, 1, 1, 1)
        );
        assert_eq!(figures.finish_text(), "max_turns 1, submitted 2");
        let set = EpisodeSet {
            name: "iteration-000003".into(),
            path: "/r/rollouts/iteration-000003.jsonl".into(),
            iteration: Some(3),
            summary: Some(json!({"phase": "dapo"})),
        };
        let html = set_page(&set, &episodes);
        assert!(html.contains("<title>iteration 3 (dapo)</title>"));
        // Tasks in the order they first appear; a group's episodes in one row.
        let b = html.find("<code>b&lt;2&gt;</code>").unwrap();
        let a = html.find("<code>a</code>").unwrap();
        assert!(b < a);
        assert!(html.contains("<td class=\"num resolved\">1 / 2</td>"));
        assert!(html.contains("<a class=\"episode resolved\" href=\"episode-000000.html\">#0 · 1.00 · 1 turn · submitted</a>"));
        assert!(html.contains("<a class=\"episode suspicious-episode\" href=\"episode-000001.html\">#1 · 0.00 · 2 turns · submitted · 1 format error ⚠</a>"));
        assert!(html.contains("<td class=\"num flag\">1</td>"));
    }
}
