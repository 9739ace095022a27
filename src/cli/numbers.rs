//! Value parsers for numeric flags with a range: `--lr NaN`, `--lr -1` or `--eps-low 1.5` are
//! errors naming the flag (clap adds it), not runs that train nothing. The same parsers check a
//! `--config` file's values, so the file gets the same errors, with its line.

/// A number parsed as f64 that must be finite and lie in a range.
pub fn number_in(
    text: &str,
    low: f64,
    low_inclusive: bool,
    high: Option<f64>,
) -> Result<f64, String> {
    let v = match text.parse::<f64>() {
        Ok(v) if v.is_finite() => v,
        Ok(v) => return Err(format!("{v} is not a finite number")),
        Err(e) => return Err(format!("{text:?} is not a number: {e}")),
    };
    let above = if low_inclusive { v >= low } else { v > low };
    let (low_bracket, low_word) = if low_inclusive {
        ("[", "at least")
    } else {
        ("(", "greater than")
    };
    match high {
        Some(high) if !(above && v < high) => Err(format!(
            "{v} is outside {low_bracket}{low}, {high}): it must be {low_word} {low} and below {high}"
        )),
        None if !above => Err(format!("{v} must be {low_word} {low}")),
        _ => Ok(v),
    }
}

/// Finite and > 0: learning rates, the TIS cap.
pub fn positive_f64(text: &str) -> Result<f64, String> {
    number_in(text, 0.0, false, None)
}

pub fn positive_f32(text: &str) -> Result<f32, String> {
    positive_f64(text).map(|v| v as f32)
}

/// Finite and >= 0: weight decay, gradient clipping (0: off), the upper clip range.
pub fn non_negative_f64(text: &str) -> Result<f64, String> {
    number_in(text, 0.0, true, None)
}

pub fn non_negative_f32(text: &str) -> Result<f32, String> {
    non_negative_f64(text).map(|v| v as f32)
}

/// In [0, 1): the lower clip range (1 - eps_low must stay positive).
pub fn eps_low_f32(text: &str) -> Result<f32, String> {
    number_in(text, 0.0, true, Some(1.0)).map(|v| v as f32)
}
