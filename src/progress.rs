//! A progress bar on stderr for long work: redrawn in place on a terminal (at most 10 times a
//! second), a plain line every 10% or 30 s otherwise (logs, CI).
//!
//! ```text
//!   rollout [##########..........] 20/40 · 55 s · ETA 55 s · resolved 7 · 412 tok/s
//! ```

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Progress {
    label: String,
    total: usize,
    started: Instant,
    terminal: bool,
    state: Mutex<DrawState>,
}

struct DrawState {
    last_draw: Option<Instant>,
    last_decile: usize,
}

fn stderr_is_terminal() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(2) == 1 }
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

impl Progress {
    pub fn new(label: &str, total: usize) -> Self {
        Self {
            label: label.to_string(),
            total,
            started: Instant::now(),
            terminal: stderr_is_terminal(),
            state: Mutex::new(DrawState {
                last_draw: None,
                last_decile: 0,
            }),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn line(&self, done: usize, detail: &str) -> String {
        const WIDTH: usize = 20;
        let filled = (done * WIDTH)
            .checked_div(self.total)
            .unwrap_or(WIDTH)
            .min(WIDTH);
        let elapsed = self.started.elapsed();
        let eta = if done > 0 && done < self.total {
            let per = elapsed.as_secs_f64() / done as f64;
            format!(
                " · ETA {}",
                human(Duration::from_secs_f64(per * (self.total - done) as f64))
            )
        } else {
            String::new()
        };
        let detail = if detail.is_empty() {
            String::new()
        } else {
            format!(" · {detail}")
        };
        format!(
            "{} [{}{}] {done}/{} · {}{eta}{detail}",
            self.label,
            "#".repeat(filled),
            ".".repeat(WIDTH - filled),
            self.total,
            human(elapsed),
        )
    }

    /// Reports `done` of the total, with a short detail (rates, counts).
    pub fn update(&self, done: usize, detail: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if self.terminal {
            if state
                .last_draw
                .is_some_and(|t| now - t < Duration::from_millis(100))
                && done < self.total
            {
                return;
            }
            state.last_draw = Some(now);
            eprint!("\r\x1b[2K{}", self.line(done, detail));
            let _ = std::io::stderr().flush();
        } else {
            let decile = (done * 10).checked_div(self.total).unwrap_or(10);
            let stale = state
                .last_draw
                .is_none_or(|t| now - t >= Duration::from_secs(30));
            if decile > state.last_decile || stale {
                state.last_decile = decile;
                state.last_draw = Some(now);
                eprintln!("{}", self.line(done, detail));
            }
        }
    }

    /// The last line, left on screen.
    pub fn finish(&self, detail: &str) {
        let line = self.line(self.total, detail);
        if self.terminal {
            eprintln!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_shows_bar_counts_and_detail() {
        let p = Progress::new("rollout", 40);
        let line = p.line(20, "resolved 7");
        assert!(
            line.starts_with("rollout [##########..........] 20/40 · "),
            "{line}"
        );
        assert!(line.ends_with(" · resolved 7"), "{line}");
        assert!(Progress::new("x", 0)
            .line(0, "")
            .contains("[####################] 0/0"));
        assert_eq!(human(Duration::from_secs(75)), "1m15s");
    }
}
