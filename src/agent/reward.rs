//! The reward of one trajectory (RL-SPEC.md): tests pass, plus a penalty for long episodes.
//!
//! ```text
//!   R = 1[resolved] + R_len,   R_len = 0                                  turns < L_thr
//!                                      (L_thr - turns) / (T_max - L_thr)  otherwise
//! ```

/// `turns` = the number of actions (assistant turns); `turn_threshold` = L_thr, `max_turns` =
/// T_max (the penalty reaches -1 at T_max).
pub fn reward(resolved: bool, turns: usize, turn_threshold: usize, max_turns: usize) -> f64 {
    let base = if resolved { 1.0 } else { 0.0 };
    if turns < turn_threshold || max_turns <= turn_threshold {
        return base;
    }
    base + (turn_threshold as f64 - turns as f64) / (max_turns as f64 - turn_threshold as f64)
}

#[cfg(test)]
mod tests {
    use super::reward;

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
}
