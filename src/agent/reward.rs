//! The reward of one trajectory (RL-SPEC.md): tests pass, plus a penalty for long episodes, and
//! what a flagged change (`AgentDiff::suspicious`, env/flags.rs) costs.
//!
//! ```text
//!   R = 1[resolved] + R_len,   R_len = 0                                  turns < L_thr
//!                                      (L_thr - turns) / (T_max - L_thr)  otherwise
//!
//!   --suspicious-reward   a flagged episode gets            (an unflagged one: R)
//!     keep (default)      R                                  the flags are only reported
//!     zero                R - 1[resolved]  = R_len           passing the tests earns nothing
//!     penalty             R - 1[resolved] - 1  = R_len - 1   below any unflagged episode
//! ```
//!
//! With `penalty` a flagged episode scores at most -1, never above an unflagged one (R >= -1),
//! so within a group a flag is never worth having, whatever the tests said.

/// `turns` = the number of actions (assistant turns); `turn_threshold` = L_thr, `max_turns` =
/// T_max (the penalty reaches -1 at T_max).
pub fn reward(resolved: bool, turns: usize, turn_threshold: usize, max_turns: usize) -> f64 {
    let base = if resolved { 1.0 } else { 0.0 };
    if turns < turn_threshold || max_turns <= turn_threshold {
        return base;
    }
    base + (turn_threshold as f64 - turns as f64) / (max_turns as f64 - turn_threshold as f64)
}

/// What a flagged episode's reward becomes (`--suspicious-reward`; the module's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SuspiciousReward {
    /// Unchanged: flags are reported, not priced.
    #[default]
    Keep,
    /// The resolved term is dropped: R - 1[resolved] (= R_len).
    Zero,
    /// The resolved term is dropped and 1 taken: R - 1[resolved] - 1.
    Penalty,
}

impl SuspiciousReward {
    /// The names `--suspicious-reward` takes.
    pub const NAMES: [&'static str; 3] = ["keep", "zero", "penalty"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keep => "keep",
            Self::Zero => "zero",
            Self::Penalty => "penalty",
        }
    }

    /// `reward` (from [`reward`]) for an episode that `resolved` and was `flagged` or not.
    pub fn apply(self, reward: f64, resolved: bool, flagged: bool) -> f64 {
        let resolved_term = if resolved { 1.0 } else { 0.0 };
        match (self, flagged) {
            (_, false) | (Self::Keep, true) => reward,
            (Self::Zero, true) => reward - resolved_term,
            (Self::Penalty, true) => reward - resolved_term - 1.0,
        }
    }
}

impl std::fmt::Display for SuspiciousReward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SuspiciousReward {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "keep" => Ok(Self::Keep),
            "zero" => Ok(Self::Zero),
            "penalty" => Ok(Self::Penalty),
            other => Err(format!(
                "unknown suspicious-reward {other:?} (expected keep, zero or penalty)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{reward, SuspiciousReward};

    #[test]
    fn rl_spec_values() {
        assert_eq!(reward(true, 3, 10, 40), 1.0);
        assert_eq!(reward(false, 9, 10, 40), 0.0);
        assert_eq!(reward(true, 10, 10, 40), 1.0);
        assert!((reward(true, 25, 10, 40) - 0.5).abs() < 1e-12);
        assert!((reward(false, 40, 10, 40) + 1.0).abs() < 1e-12);
        assert!((reward(false, 80, 10, 80) + 1.0).abs() < 1e-12);
        // No penalty range (T_max <= L_thr): no penalty.
        assert_eq!(reward(true, 12, 10, 10), 1.0);
    }

    #[test]
    fn suspicious_reward_formulas() {
        use SuspiciousReward::*;
        // (resolved, turns) -> R = 1[resolved] + R_len with L_thr 10, T_max 40.
        for (resolved, turns) in [(true, 3), (true, 25), (false, 3), (false, 40)] {
            let r = reward(resolved, turns, 10, 40);
            let r_len = r - if resolved { 1.0 } else { 0.0 };
            for mode in [Keep, Zero, Penalty] {
                assert_eq!(mode.apply(r, resolved, false), r, "unflagged: unchanged");
            }
            assert_eq!(Keep.apply(r, resolved, true), r);
            assert!((Zero.apply(r, resolved, true) - r_len).abs() < 1e-12);
            assert!((Penalty.apply(r, resolved, true) - (r_len - 1.0)).abs() < 1e-12);
        }
        assert_eq!(Zero.apply(1.0, true, true), 0.0);
        assert_eq!(Penalty.apply(1.0, true, true), -1.0);
        assert_eq!(Penalty.apply(0.0, false, true), -1.0);
        assert!((Penalty.apply(0.5, true, true) + 1.5).abs() < 1e-12);
    }

    #[test]
    fn suspicious_reward_names() {
        for name in SuspiciousReward::NAMES {
            let mode: SuspiciousReward = name.parse().unwrap();
            assert_eq!((mode.as_str(), mode.to_string()), (name, name.to_string()));
        }
        assert_eq!(SuspiciousReward::default(), SuspiciousReward::Keep);
        let err = "Zero".parse::<SuspiciousReward>().unwrap_err();
        assert!(
            err.contains("\"Zero\" (expected keep, zero or penalty)"),
            "{err}"
        );
    }
}
