//! The toy environment: guess a hidden number, played in process behind the same
//! [`Environment`]/[`Sandbox`] traits as the real sandboxes, so a toy episode goes through the
//! real scaffold, tool-call parser, engine and trainer (`--tasks builtin:toy`).
//!
//! ```text
//!   bash "guess N"  ->  "higher" | "lower" | "correct"     (exit 0; "correct" ends the
//!                                                          episode, as a submit would)
//!   bash "check"    ->  exit 0 when the last guess was the hidden number (grading)
//!   anything else   ->  a usage message, exit 2
//! ```
//!
//! The observations matter: after one guess, "higher" or "lower" halves what is left, and the
//! turn penalty rewards finding the number in fewer guesses. (`submit` before the number is
//! found is graded unresolved.)

use super::{CommandOutput, Environment, Limits, RepoSource, Sandbox, Task};
use anyhow::{bail, Result};
use std::path::Path;
use std::time::{Duration, Instant};

pub struct ToyEnvironment {
    limits: Limits,
}

impl ToyEnvironment {
    pub fn new(limits: Limits) -> Self {
        Self { limits }
    }
}

impl Environment for ToyEnvironment {
    fn name(&self) -> &'static str {
        "toy"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn start(&self, task: &Task, _episode: &str) -> Result<Box<dyn Sandbox>> {
        let RepoSource::Toy { hidden, low, high } = task.repo else {
            bail!(
                "task {} ({}) is not a toy task: the toy environment only plays `toy` lines",
                task.id,
                task.origin
            );
        };
        Ok(Box::new(ToySandbox {
            hidden,
            low,
            high,
            last_guess: None,
            limits: self.limits.clone(),
        }))
    }
}

pub struct ToySandbox {
    hidden: i64,
    low: i64,
    high: i64,
    last_guess: Option<i64>,
    limits: Limits,
}

impl ToySandbox {
    fn answer(&mut self, command: &str) -> (String, i32) {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["guess", n] => match n.parse::<i64>() {
                Ok(n) if (self.low..=self.high).contains(&n) => {
                    self.last_guess = Some(n);
                    let word = match n.cmp(&self.hidden) {
                        std::cmp::Ordering::Less => "higher",
                        std::cmp::Ordering::Greater => "lower",
                        std::cmp::Ordering::Equal => "correct",
                    };
                    (word.to_string(), 0)
                }
                _ => (
                    format!("guess a whole number from {} to {}", self.low, self.high),
                    2,
                ),
            },
            ["check"] => {
                let solved = self.last_guess == Some(self.hidden);
                (
                    if solved { "solved" } else { "unsolved" }.to_string(),
                    if solved { 0 } else { 1 },
                )
            }
            _ => ("usage: guess N".to_string(), 2),
        }
    }
}

impl Sandbox for ToySandbox {
    fn workdir(&self) -> &str {
        "/toy"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn exec(
        &mut self,
        command: &str,
        _stdin: Option<&[u8]>,
        _timeout: Duration,
        _output_bytes: usize,
    ) -> Result<CommandOutput> {
        let started = Instant::now();
        let (output, code) = self.answer(command);
        Ok(CommandOutput {
            ends_episode: output == "correct",
            output,
            exit_code: Some(code),
            elapsed: started.elapsed(),
            ..CommandOutput::default()
        })
    }

    fn copy_in(&mut self, _host_dir: &Path) -> Result<()> {
        bail!("the toy environment has no files")
    }

    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_game_answers_and_grades() {
        let mut s = ToySandbox {
            hidden: 3,
            low: 1,
            high: 4,
            last_guess: None,
            limits: Limits::default(),
        };
        assert_eq!(s.answer("guess 1"), ("higher".into(), 0));
        assert_eq!(s.answer("guess 4"), ("lower".into(), 0));
        assert_eq!(s.answer("check").1, 1);
        assert_eq!(s.answer("guess 3"), ("correct".into(), 0));
        assert_eq!(s.answer("check").1, 0);
        assert_eq!(s.answer("guess 9").1, 2);
        assert_eq!(s.answer("ls").1, 2);
    }
}
