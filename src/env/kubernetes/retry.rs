//! API calls with a time limit each, retried with jittered exponential backoff when the answer
//! says "try again" (429 Too Many Requests, 5xx) or no answer came (connection refused or reset,
//! the time limit). Other answers (400, 403, 404, 409, ...) are returned at once: the caller
//! decides (a 404 on delete is success, a 409 on create means the name exists).

use super::config::RetryPolicy;
use crate::rng::{Rng, SplitMix64};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An API call's failure, classified.
#[derive(Debug)]
pub enum CallError {
    /// The API answered with this status code (and message).
    Status(u16, String),
    /// No usable answer (transport error, time limit, undecodable body).
    Transport(String),
}

impl CallError {
    pub fn from_kube(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(r) => Self::Status(r.code, format!("{} ({})", r.message, r.reason)),
            kube::Error::UpgradeConnection(
                kube::client::UpgradeConnectionError::ProtocolSwitch(code),
            ) => Self::Status(
                code.as_u16(),
                format!("the exec upgrade was answered {code}"),
            ),
            other => Self::Transport(format!("{other}")),
        }
    }

    /// 429, 5xx, or no answer.
    pub fn retryable(&self) -> bool {
        match self {
            Self::Status(code, _) => *code == 429 || (500..600).contains(code),
            Self::Transport(_) => true,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status(code, _) => Some(*code),
            Self::Transport(_) => None,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Status(code, message) => write!(f, "HTTP {code}: {message}"),
            Self::Transport(message) => write!(f, "no answer: {message}"),
        }
    }
}

/// The wait before retry `attempt` (0 for the first retry): uniform in `[d/2, d]`,
/// `d = min(cap, base * 2^attempt)`.
pub fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let full = policy
        .base
        .saturating_mul(1u32 << attempt.min(20))
        .min(policy.cap);
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ CALLS
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let unit = (SplitMix64::new(seed).next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    full / 2 + full.mul_f64(unit / 2.0)
}

/// Runs `call` (each try within `limit`) until it succeeds, fails for good, or `policy.attempts`
/// tries have failed retryably. `what` names the call in the error.
pub async fn with_retries<T, F, Fut>(
    policy: &RetryPolicy,
    limit: Duration,
    what: &str,
    mut call: F,
) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = kube::Result<T>>,
{
    let mut attempt = 0;
    loop {
        let error = match tokio::time::timeout(limit, call()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => CallError::from_kube(e),
            Err(_) => CallError::Transport(format!(
                "{what} did not answer within {:.0} s",
                limit.as_secs_f64()
            )),
        };
        attempt += 1;
        if !error.retryable() || attempt >= policy.attempts {
            return Err(match error {
                CallError::Status(code, m) if attempt > 1 => {
                    CallError::Status(code, format!("{m} (after {attempt} tries)"))
                }
                CallError::Transport(m) if attempt > 1 => {
                    CallError::Transport(format!("{m} (after {attempt} tries)"))
                }
                e => e,
            });
        }
        tokio::time::sleep(backoff(policy, attempt - 1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_stays_bounded_and_jitters() {
        let policy = RetryPolicy {
            attempts: 6,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        for attempt in 0..30 {
            let full = (Duration::from_millis(100) * 2u32.pow(attempt.min(10))).min(policy.cap);
            let d = backoff(&policy, attempt);
            assert!(d >= full / 2 && d <= full, "{attempt}: {d:?}");
        }
        let waits: std::collections::HashSet<Duration> =
            (0..20).map(|_| backoff(&policy, 5)).collect();
        assert!(waits.len() > 1, "no jitter: {waits:?}");
    }

    #[test]
    fn only_throttling_server_errors_and_silence_are_retried() {
        assert!(CallError::Status(429, String::new()).retryable());
        assert!(CallError::Status(503, String::new()).retryable());
        assert!(CallError::Transport(String::new()).retryable());
        for code in [400, 403, 404, 409, 422] {
            assert!(
                !CallError::Status(code, String::new()).retryable(),
                "{code}"
            );
        }
    }
}
