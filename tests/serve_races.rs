//! swerve-serve's control routes under a steady load of generation requests from client threads:
//! `/pause?mode=wait` ends once the requests in flight at the pause have finished (new ones wait
//! for `/resume` rather than keep the wait going), and `/sleep` releases the KV cache with no
//! request slipping in between (every request either runs or gets 503 while asleep).

mod common;

use common::serve::*;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One generation request as a client thread saw it.
#[derive(Clone, Debug)]
struct Outcome {
    sent: Instant,
    answered: Instant,
    status: u16,
    body: String,
}

/// Client threads that each send generation requests in a loop until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    clients: Vec<JoinHandle<()>>,
}

impl Load {
    /// `clients` threads sending `body` to /v1/completions, each waiting up to `gap_ms`
    /// (varying by thread and request) before its next request.
    fn start(addr: SocketAddr, clients: usize, body: serde_json::Value, gap_ms: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..clients)
            .map(|client| {
                let (stop, outcomes) = (stop.clone(), outcomes.clone());
                let body = body.to_string();
                std::thread::spawn(move || {
                    let mut n = client as u64;
                    while !stop.load(Ordering::SeqCst) {
                        let sent = Instant::now();
                        let r = request(addr, "POST", "/v1/completions", &[], body.as_bytes());
                        outcomes.lock().unwrap().push(Outcome {
                            sent,
                            answered: Instant::now(),
                            status: r.status,
                            body: r.text(),
                        });
                        n = n
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        if gap_ms > 0 {
                            std::thread::sleep(Duration::from_micros((n >> 33) % (gap_ms * 1000)));
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            outcomes,
            clients,
        }
    }

    fn outcomes(&self) -> Vec<Outcome> {
        self.outcomes.lock().unwrap().clone()
    }

    /// Waits until `count` requests have been answered (10 s at most).
    fn wait_for_answers(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.outcomes.lock().unwrap().len() < count {
            assert!(Instant::now() < deadline, "the load never got going");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the clients and returns every outcome once their last requests are answered.
    fn finish(mut self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::SeqCst);
        for client in std::mem::take(&mut self.clients) {
            client.join().expect("a client thread panicked");
        }
        self.outcomes()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A control call on its own thread, required to answer within `limit`.
fn call_within(server: &Server, path: &'static str, limit: Duration) -> Response {
    let addr = server.addr;
    let call = std::thread::spawn(move || request(addr, "POST", path, &[], b"{}"));
    let deadline = Instant::now() + limit;
    while !call.is_finished() {
        assert!(
            Instant::now() < deadline,
            "POST {path} did not answer within {limit:?} under load:\n{}",
            server.get("/metrics").text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    call.join().unwrap()
}

/// `/pause?mode=wait` under a steady stream of requests answers once the requests in flight at
/// the pause are done; requests sent while paused start only after `/resume`, and every request
/// succeeds.
#[test]
fn pause_wait_ends_under_load_and_holds_new_requests_until_resume() {
    let server = Server::start(&scripted_model(), &[]);
    let body = json!({"prompt": [31, 32, 33, 34], "max_tokens": 24, "ignore_eos": true});
    let load = Load::start(server.addr, 8, body, 0);
    load.wait_for_answers(16);

    let r = call_within(&server, "/pause?mode=wait", Duration::from_secs(20));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["paused"], true);
    let paused_at = Instant::now();
    assert_eq!(server.metric("swerve_paused"), 1.0);
    // Nothing runs while paused: no step, no token; the clients' new requests are held.
    let steps = server.metric("swerve_engine_steps_total");
    let tokens = server.metric("swerve_engine_generated_tokens_total");
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(server.metric("swerve_engine_steps_total"), steps);
    assert_eq!(
        server.metric("swerve_engine_generated_tokens_total"),
        tokens
    );
    assert_eq!(server.metric("swerve_engine_running"), 0.0);
    assert_eq!(
        server.metric("swerve_engine_held"),
        8.0,
        "every client waits"
    );
    let resumed_at = Instant::now();
    let r = server.post("/resume", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());

    let after_resume = load.outcomes().len() + 16;
    load.wait_for_answers(after_resume);
    let outcomes = load.finish();
    for o in &outcomes {
        assert_eq!(o.status, 200, "{}", o.body);
    }
    let sent_while_paused: Vec<&Outcome> = outcomes.iter().filter(|o| o.sent > paused_at).collect();
    assert!(!sent_while_paused.is_empty());
    for o in sent_while_paused {
        assert!(
            o.answered > resumed_at,
            "a request sent while paused was answered before the resume"
        );
    }
    server.wait_idle();
}

/// Rounds of `/pause?mode=wait`, `/sleep`, `/wake_up` and `/resume` (an RL step) while
/// clients keep sending requests: each sleep answers at once and leaves the KV cache released
/// while requests keep coming; the requests the pause held, and those sent while asleep, are
/// refused with 503 (the held ones by the engine thread, in the sleep's own command); every
/// request either ran (200) or got that 503, none another status or no answer.
#[test]
fn sleep_under_load_releases_the_kv_cache_and_refuses_requests_with_503() {
    let server = Server::start(&scripted_model(), &[]);
    let body = json!({"prompt": [41, 42, 43], "max_tokens": 4, "ignore_eos": true});
    let load = Load::start(server.addr, 12, body, 2);
    load.wait_for_answers(24);
    let rounds = 10;
    for round in 0..rounds {
        let r = call_within(&server, "/pause?mode=wait", Duration::from_secs(20));
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        // Let the clients' next requests be held by the pause.
        std::thread::sleep(Duration::from_millis(50));
        let r = server.post("/sleep", &json!({}));
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        assert_eq!(
            server.metric("swerve_kv_cache_allocated"),
            0.0,
            "round {round}: the KV cache is allocated right after /sleep"
        );
        // The held requests were refused, none entered the engine.
        assert_eq!(server.metric("swerve_engine_held"), 0.0);
        assert_eq!(
            server.metric("swerve_engine_waiting") + server.metric("swerve_engine_running"),
            0.0,
            "round {round}: requests entered the engine after /sleep"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(server.metric("swerve_kv_cache_allocated"), 0.0);
        assert_eq!(server.get("/is_sleeping").json()["is_sleeping"], true);
        let r = server.post("/wake_up", &json!({}));
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        assert_eq!(server.metric("swerve_kv_cache_allocated"), 1.0);
        let r = server.post("/resume", &json!({}));
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        let answered = load.outcomes().len();
        load.wait_for_answers(answered + 12);
    }
    let outcomes = load.finish();
    let mut succeeded = 0;
    let mut refused = 0;
    for o in &outcomes {
        match o.status {
            200 => succeeded += 1,
            503 => {
                assert!(o.body.contains("/wake_up"), "{}", o.body);
                refused += 1;
            }
            other => panic!(
                "a request during the sleep rounds got {other}, not 200 or 503: {}",
                o.body
            ),
        }
    }
    eprintln!("{rounds} sleep rounds: {succeeded} requests ran, {refused} refused as asleep");
    assert!(succeeded > 0 && refused >= rounds);
    server.wait_idle();
}
