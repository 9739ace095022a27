//! `swerve-train report OUT`: a run's episodes as static HTML pages (no server, no script),
//! to read what the agent actually did.
//!
//! ```text
//!   OUT (rollout, eval, rl --save-rollouts) ─► load (sets, lines checked one at a time)
//!      ─► HTML_DIR/index.html                     a row per set: its figures
//!         HTML_DIR/SET/index.html                 a row per task: the group's episodes
//!         HTML_DIR/SET/episode-LINE.html          an episode: the suspicious flag, facts,
//!                                                 conversation, grading, diff, tokens by mask
//! ```
//!
//! SET is `rollout` (or `eval`) or `iteration-N`; LINE is the episode's line in its file. Each
//! set's folder is written under `SET.partial` and renamed into place, replacing an older
//! report's. Every character from the data is escaped ([`html::escape`]); long texts are cut
//! for display with their whole text behind a `<details>` ([`html::long_text`]).

pub mod conversation;
pub mod episode_page;
pub mod html;
pub mod index_page;
pub mod load;
pub mod run_tokenizer;
pub mod set_page;
pub mod token_spans;

use anyhow::{bail, Context, Result};
use episode_page::{episode_page, EpisodePlace};
use load::{find_inputs, EpisodeLine, EpisodeLines, EpisodeSet};
use run_tokenizer::{find_tokenizer, RunTokenizer};
use set_page::{set_page, set_title, EpisodeSummary, SetFigures};
use std::path::{Path, PathBuf};

/// What `swerve-train report` takes.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// The run folder: a `rollout`/`eval` OUT or an `rl` OUT.
    pub run: PathBuf,
    /// Where the pages go (default `RUN/report`).
    pub html_dir: Option<PathBuf>,
    /// A folder with the tokenizer to decode token ids with (default: the run's own).
    pub tokenizer: Option<PathBuf>,
}

/// What the report wrote.
#[derive(Clone, Debug)]
pub struct ReportWritten {
    pub index: PathBuf,
    /// The first set's first episode's page, if any set has an episode.
    pub first_episode: Option<PathBuf>,
    pub episode_pages: usize,
}

/// Writes the report (see the module's diagram).
pub fn write_report(options: &ReportOptions) -> Result<ReportWritten> {
    let inputs = find_inputs(&options.run)?;
    let tokenizer = find_tokenizer(&inputs, options.tokenizer.as_deref())?;
    let html_dir = options
        .html_dir
        .clone()
        .unwrap_or_else(|| options.run.join("report"));
    prepare_html_dir(&html_dir)?;
    let mut sets = Vec::new();
    let mut first_episode = None;
    let mut episode_pages = 0;
    for set in &inputs.sets {
        let episodes = write_set(set, &html_dir, &tokenizer)?;
        if first_episode.is_none() {
            first_episode = episodes
                .first()
                .map(|e| html_dir.join(&set.name).join(&e.page));
        }
        episode_pages += episodes.len();
        sets.push((set.clone(), SetFigures::of(&episodes)));
    }
    let index = html_dir.join("index.html");
    let html = index_page::index_page(&inputs.out, &sets, &tokenizer.origin);
    std::fs::write(&index, html).with_context(|| format!("cannot write {}", index.display()))?;
    Ok(ReportWritten {
        index,
        first_episode,
        episode_pages,
    })
}

/// Creates `dir`, or checks that what is in it is an earlier report (its index.html says so):
/// the report never writes over someone else's files.
fn prepare_html_dir(dir: &Path) -> Result<()> {
    let has_files = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some());
    if has_files {
        let index = dir.join("index.html");
        let ours = std::fs::read_to_string(&index).is_ok_and(|t| t.contains(html::GENERATOR));
        if !ours {
            bail!(
                "{}: the folder holds files that are not a swerve report (no index.html written by \
                 `{}`): choose another --out",
                dir.display(),
                html::GENERATOR
            );
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// Writes a set's folder (its episode pages and its page) and returns its episodes.
fn write_set(
    set: &EpisodeSet,
    html_dir: &Path,
    tokenizer: &RunTokenizer,
) -> Result<Vec<EpisodeSummary>> {
    let final_dir = html_dir.join(&set.name);
    let partial = html_dir.join(format!("{}.partial", set.name));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)
            .with_context(|| format!("cannot remove {}", partial.display()))?;
    }
    std::fs::create_dir_all(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let episodes = match write_set_pages(set, &partial, tokenizer) {
        Ok(episodes) => episodes,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(e);
        }
    };
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir)
            .with_context(|| format!("cannot remove {}", final_dir.display()))?;
    }
    std::fs::rename(&partial, &final_dir).with_context(|| {
        format!(
            "cannot move {} to {}",
            partial.display(),
            final_dir.display()
        )
    })?;
    Ok(episodes)
}

/// Writes a set's episode pages and its page into `dir`; returns its episodes.
fn write_set_pages(
    set: &EpisodeSet,
    dir: &Path,
    tokenizer: &RunTokenizer,
) -> Result<Vec<EpisodeSummary>> {
    let title = set_title(set);
    let mut lines = EpisodeLines::open(&set.path)?;
    let mut episodes: Vec<EpisodeSummary> = Vec::new();
    // An episode's page links to the next one, so each is written once the next is read.
    let mut pending: Option<(EpisodeLine, String)> = None;
    while let Some(line) = lines.next_episode()? {
        let page_name = format!("episode-{:06}.html", line.line_no);
        if let Some((previous, name)) = pending.take() {
            let place = (name.as_str(), title.as_str(), Some(page_name.as_str()));
            write_episode(dir, &previous, place, &episodes, tokenizer)?;
            episodes.push(EpisodeSummary::of(&previous, name));
        }
        pending = Some((line, page_name));
    }
    if let Some((last, name)) = pending.take() {
        write_episode(dir, &last, (&name, &title, None), &episodes, tokenizer)?;
        episodes.push(EpisodeSummary::of(&last, name));
    }
    let page = dir.join("index.html");
    std::fs::write(&page, set_page(set, &episodes))
        .with_context(|| format!("cannot write {}", page.display()))?;
    Ok(episodes)
}

/// Writes `line`'s page: `(name, set title, next page)`, after the pages of `before`.
fn write_episode(
    dir: &Path,
    line: &EpisodeLine,
    (name, set_title, next): (&str, &str, Option<&str>),
    before: &[EpisodeSummary],
    tokenizer: &RunTokenizer,
) -> Result<()> {
    let place = EpisodePlace {
        set_title,
        previous: before.last().map(|e| e.page.as_str()),
        next,
    };
    let path = dir.join(name);
    std::fs::write(&path, episode_page(line, &place, tokenizer))
        .with_context(|| format!("cannot write {}", path.display()))
}
