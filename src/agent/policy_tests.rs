//! [`ServerPolicy`] against a fake server (std sockets, one canned answer per connection):
//! aborted, cut and empty replies are errors, never turns, and an episode retries them
//! `infra_retries` times, then ends as an infrastructure failure with no reply kept.

use super::*;
use crate::agent::episode::{run_episode, EpisodeConfig, EpisodeContext, Finish};
use crate::chat::ChatTemplate;
use crate::env::toy::ToyEnvironment;
use crate::env::{Grading, Limits, RepoSource, Task};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A server on 127.0.0.1 that reads each request and writes `answer` (raw bytes, possibly
/// none) before closing the connection; counts the requests.
struct FakeServer {
    address: String,
    requests: Arc<AtomicUsize>,
}

impl FakeServer {
    fn start(answer: Vec<u8>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                read_request(&mut stream);
                count.fetch_add(1, Ordering::SeqCst);
                let _ = stream.write_all(&answer);
            }
        });
        FakeServer { address, requests }
    }

    /// A 200 answer with this JSON body.
    fn json(body: Value) -> FakeServer {
        let body = body.to_string();
        Self::start(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    }

    fn policy(&self) -> ServerPolicy {
        ServerPolicy::new(&format!("http://{}", self.address), None, vec![IM_END_ID]).unwrap()
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// `<|im_end|>` in Qwen2.5's vocabulary.
const IM_END_ID: u32 = 151_645;

/// Reads one request's head and its `Content-Length` body.
fn read_request(stream: &mut std::net::TcpStream) {
    let mut reader = BufReader::new(stream);
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
}

/// A `/v1/completions` answer with one choice.
fn completion(tokens: &[u32], finish_reason: Value) -> Value {
    let logprobs: Vec<f32> = tokens.iter().map(|_| -0.5).collect();
    json!({"choices": [{
        "text": "", "token_ids": tokens, "finish_reason": finish_reason,
        "logprobs": {"token_logprobs": logprobs},
    }], "weight_version": 3})
}

fn toy_task() -> Task {
    Task {
        id: "toy-1".into(),
        problem_statement: "Guess the number between 1 and 4.".into(),
        repo: RepoSource::Toy {
            hidden: 3,
            low: 1,
            high: 4,
        },
        grading: Grading::Command {
            test_command: "check".into(),
        },
        setup: Vec::new(),
        solution: None,
        gold_patch: None,
        timeout_s: 10,
        image: None,
        activate: None,
        repo_name: None,
        version: None,
        environment_setup_commit: None,
        origin: "policy_tests".into(),
    }
}

/// The policy's turn for a short prompt.
fn generate(policy: &ServerPolicy) -> Result<TurnOutput> {
    let task = toy_task();
    policy.generate(&TurnInput {
        task: &task,
        tokens: &[1, 2, 3],
        turn: 1,
        max_tokens: 16,
        seed: 7,
    })
}

#[test]
fn whole_replies_are_turns() {
    let server = FakeServer::json(completion(&[10, 11, IM_END_ID], json!("stop")));
    let out = generate(&server.policy()).unwrap();
    assert_eq!(out.tokens, [10, 11, IM_END_ID]);
    assert!(out.stopped);
    assert_eq!(out.weight_version, Some(3));
    let server = FakeServer::json(completion(&[10, 11], json!("length")));
    assert!(!generate(&server.policy()).unwrap().stopped);
}

#[test]
fn aborted_cut_and_empty_replies_are_errors() {
    let cases: Vec<(&str, FakeServer, &str)> = vec![
        (
            "aborted before any token",
            FakeServer::json(completion(&[], json!("abort"))),
            "aborted the request after 0 tokens",
        ),
        (
            "aborted after some tokens",
            FakeServer::json(completion(&[10, 11, 12], json!("abort"))),
            "aborted the request after 3 tokens",
        ),
        (
            "cut with no finish reason",
            FakeServer::json(completion(&[10, 11], Value::Null)),
            "finish_reason None",
        ),
        (
            "an unknown finish reason",
            FakeServer::json(completion(&[10, 11], json!("cancelled"))),
            "finish_reason Some(\"cancelled\")",
        ),
        (
            "stopped with no token",
            FakeServer::json(completion(&[], json!("stop"))),
            "no token",
        ),
        (
            "no choices",
            FakeServer::json(json!({"choices": []})),
            "without choices",
        ),
        (
            "an empty 200 body",
            FakeServer::start(
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
            ),
            "not JSON",
        ),
        (
            "the connection closed with no answer",
            FakeServer::start(Vec::new()),
            "no HTTP header",
        ),
        (
            "swerve-serve's abort error",
            FakeServer::start(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
                    .to_vec(),
            ),
            "HTTP 503",
        ),
    ];
    for (what, server, message) in cases {
        let error = match generate(&server.policy()) {
            Ok(out) => panic!("{what}: a turn of {:?}", out.tokens),
            Err(e) => format!("{e:#}"),
        };
        assert!(error.contains(message), "{what}: {error}");
        assert_eq!(server.requests(), 1, "{what}");
    }
}

/// An episode whose every reply is aborted after some tokens.
fn aborted_episode(server: &FakeServer, infra_retries: usize) -> crate::agent::episode::Episode {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let env = ToyEnvironment::new(Limits::default());
    let policy = server.policy();
    let config = EpisodeConfig {
        infra_retries,
        ..EpisodeConfig::default()
    };
    let ctx = EpisodeContext {
        env: &env,
        policy: &policy,
        tokenizer: &tokenizer,
        template: &template,
        config: &config,
    };
    run_episode(&ctx, &toy_task(), 0, 11)
}

#[test]
fn an_episode_retries_aborted_replies_a_bounded_number_of_times() {
    for infra_retries in [0, 2] {
        let server = FakeServer::json(completion(&[10, 11, 12], json!("abort")));
        let episode = aborted_episode(&server, infra_retries);
        assert_eq!(server.requests(), infra_retries + 1);
        assert_eq!(episode.infra_retries, infra_retries);
        let Finish::Error(message) = &episode.finish else {
            panic!("finish {:?}", episode.finish);
        };
        assert!(message.contains("aborted the request"), "{message}");
        assert_eq!(episode.reward, 0.0);
        // The cut reply is not in the trajectory: no action token, no turn.
        assert_eq!(episode.action_tokens(), 0);
        assert_eq!(episode.turns, 0);
        assert_eq!(episode.generated, 0);
    }
}
