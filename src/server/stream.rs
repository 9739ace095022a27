//! `stream: true`: the response body as Server-Sent Events, `data: {chunk}\n\n` per chunk and
//! `data: [DONE]\n\n` at the end.
//!
//! The body owns the [`Run`] (and so the guard over its engine requests): when the client goes
//! away, hyper drops the body, the guard aborts every unfinished request, and their blocks return
//! to the pool. Each poll drains every event already queued, so a busy engine step becomes one
//! write per client rather than one per token.

use super::generate::{Events, Run};
use super::response::{choice_chunks, usage_chunk, Envelope};
use axum::body::Bytes;
use http_body::{Body, Frame};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Events drained per poll at most, so one body cannot hog a worker thread.
const MAX_EVENTS_PER_POLL: usize = 4096;

pub struct SseBody {
    run: Run,
    events: Events,
    envelope: Envelope,
    done: bool,
}

impl SseBody {
    pub fn new(run: Run, events: Events, envelope: Envelope) -> Self {
        Self {
            run,
            events,
            envelope,
            done: false,
        }
    }

    fn render(&mut self, out: &mut String) {
        let mut chunks = Vec::new();
        for index in 0..self.run.choices.len() {
            choice_chunks(&mut self.run, &self.envelope, index, &mut chunks);
        }
        for chunk in chunks {
            out.push_str("data: ");
            out.push_str(&chunk.to_string());
            out.push_str("\n\n");
        }
        if self.run.all_finished() {
            if self.run.job.include_usage {
                out.push_str("data: ");
                out.push_str(&usage_chunk(&self.run, &self.envelope).to_string());
                out.push_str("\n\n");
            }
            out.push_str("data: [DONE]\n\n");
            self.done = true;
        }
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let mut drained = 0;
        while !this.run.all_finished() && drained < MAX_EVENTS_PER_POLL {
            match this.events.poll_recv(cx) {
                Poll::Ready(Some((choice, event))) => {
                    this.run.handle(choice, event);
                    drained += 1;
                }
                Poll::Ready(None) => this.run.close(),
                Poll::Pending => break,
            }
        }
        let mut out = String::new();
        this.render(&mut out);
        if !out.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
        }
        if drained >= MAX_EVENTS_PER_POLL {
            // More may be queued: come back at once rather than wait for a wake-up.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
