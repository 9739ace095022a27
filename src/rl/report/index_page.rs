//! The report's front page: a row per set (the rollout, or each `rl` iteration) with its
//! figures, and which tokenizer decoded the token ids.

use super::html::{escape, page, thousands};
use super::load::EpisodeSet;
use super::set_page::{set_title, SetFigures};
use std::path::Path;

/// The index page (a whole HTML document) of the report on run folder `out`.
pub fn index_page(out: &Path, sets: &[(EpisodeSet, SetFigures)], tokenizer_origin: &str) -> String {
    let title = format!("swerve report: {}", out.display());
    let mut body = format!(
        "<h1>{}</h1>\n<p class=\"note\">Token ids decoded with: {}</p>\n",
        escape(&title),
        escape(tokenizer_origin)
    );
    body.push_str(
        "<table class=\"sets\"><tr><th>episodes of</th><th>episodes</th><th>resolved</th>\
         <th>mean reward</th><th>mean turns</th><th>format errors</th><th>suspicious</th><th>finish</th></tr>\n",
    );
    for (set, f) in sets {
        body.push_str(&format!(
            "<tr><td><a href=\"{}/index.html\">{}</a></td><td class=\"num\">{}</td>\
             <td class=\"num\">{} ({:.1}%)</td><td class=\"num\">{:.3}</td><td class=\"num\">{:.2}</td>\
             <td class=\"num\">{}</td><td class=\"num{}\">{}</td><td>{}</td></tr>\n",
            escape(&set.name),
            escape(&set_title(set)),
            thousands(f.episodes),
            thousands(f.resolved),
            100.0 * f.resolved as f64 / f.episodes.max(1) as f64,
            f.mean_reward,
            f.mean_turns,
            thousands(f.format_errors),
            if f.suspicious > 0 { " flag" } else { "" },
            thousands(f.suspicious),
            escape(&f.finish_text())
        ));
    }
    body.push_str("</table>\n");
    page(&title, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_set_is_a_row_linking_to_its_page() {
        let set = EpisodeSet {
            name: "iteration-000001".into(),
            path: "/r/rollouts/iteration-000001.jsonl".into(),
            iteration: Some(1),
            summary: None,
        };
        let figures = SetFigures {
            episodes: 4,
            resolved: 1,
            mean_reward: 0.25,
            mean_turns: 2.0,
            format_errors: 0,
            suspicious: 2,
            finish: [("submitted".to_string(), 4)].into(),
        };
        let html = index_page(Path::new("/r<un>"), &[(set, figures)], "the <embedded> one");
        assert!(html.contains("<h1>swerve report: /r&lt;un&gt;</h1>"));
        assert!(html.contains("Token ids decoded with: the &lt;embedded&gt; one"));
        assert!(html.contains("<a href=\"iteration-000001/index.html\">iteration 1</a>"));
        assert!(html.contains("<td class=\"num\">1 (25.0%)</td>"));
        assert!(html.contains("<td class=\"num flag\">2</td><td>submitted 4</td>"));
    }
}
