//! An episode's token form by action mask: the runs of tokens the trainer learns from (mask 1)
//! and those it does not (mask 0: prompts, observations, format-error turns, closing
//! `<|im_end|>`s the policy did not generate), each decoded with the run's tokenizer, or shown as
//! ids where there is none.
//!
//! ```text
//!   action_mask  0 0 0 0 1 1 1 0 0 0 1 1 0
//!   spans        [0, 4) [4, 7) [7, 10) [10, 12) [12, 13)
//!                masked trained masked trained  masked
//! ```

use super::html::{display_cut, escape, thousands};
use crate::tokenizer::Tokenizer;

/// A run of equal mask values: tokens `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskSpan {
    pub start: usize,
    pub end: usize,
    pub mask: u8,
}

/// The runs of equal values of `action_mask`, in order.
pub fn mask_spans(action_mask: &[u8]) -> Vec<MaskSpan> {
    let mut spans: Vec<MaskSpan> = Vec::new();
    for (i, &mask) in action_mask.iter().enumerate() {
        match spans.last_mut() {
            Some(last) if last.mask == mask => last.end = i + 1,
            _ => spans.push(MaskSpan {
                start: i,
                end: i + 1,
                mask,
            }),
        }
    }
    spans
}

/// The token view: a legend, the counts, and every span as text (or ids) marked by its mask.
/// `origin` says which tokenizer decoded them, or why none did.
pub fn tokens_html(
    tokens: &[u32],
    action_mask: &[u8],
    tokenizer: Option<&Tokenizer>,
    origin: &str,
) -> String {
    if tokens.is_empty() {
        return "<p class=\"note\">No tokens: the episode kept no trajectory (it failed before its first turn).</p>".into();
    }
    let spans = mask_spans(action_mask);
    let trained = action_mask.iter().filter(|&&m| m == 1).count();
    let mut html = format!(
        "<p class=\"legend\"><span class=\"mask-1\">trained: action_mask 1</span>\
         <span class=\"mask-0\">masked: action_mask 0</span></p>\n\
         <p>{} tokens: {} trained, {} masked, in {} spans. {}</p>\n<pre class=\"tokens\">",
        thousands(tokens.len()),
        thousands(trained),
        thousands(tokens.len() - trained),
        thousands(spans.len()),
        match tokenizer {
            Some(_) => format!("Decoded with {}.", escape(origin)),
            None => format!("<span class=\"warning\">{}</span>", escape(origin)),
        }
    );
    for span in &spans {
        let ids = &tokens[span.start..span.end];
        let text = match tokenizer.map(|t| t.decode(ids, false)) {
            Some(Ok(text)) => text,
            Some(Err(e)) => format!("[cannot decode: {e:#}] {}", ids_text(ids)),
            None => format!("{} ", ids_text(ids)),
        };
        html.push_str(&format!(
            "<span class=\"mask-{}\" title=\"tokens {}..{} ({}), {}\">{}</span>",
            span.mask,
            span.start,
            span.end,
            span.end - span.start,
            if span.mask == 1 { "trained" } else { "masked" },
            span_text(&text)
        ));
    }
    html.push_str("</pre>");
    html
}

fn ids_text(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

/// A span's text escaped, cut for display when long (its whole text is in the conversation).
fn span_text(text: &str) -> String {
    match display_cut(text) {
        None => escape(text),
        Some((head, tail)) => format!(
            "{}<span class=\"report-cut\">[report: {} bytes of this span not shown here; the \
             conversation above has them]</span>{}",
            escape(&text[..head]),
            thousands(tail - head),
            escape(&text[tail..])
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_the_runs_of_the_mask() {
        let spans = mask_spans(&[0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0]);
        let runs: Vec<(usize, usize, u8)> =
            spans.iter().map(|s| (s.start, s.end, s.mask)).collect();
        assert_eq!(
            runs,
            [(0, 4, 0), (4, 7, 1), (7, 10, 0), (10, 12, 1), (12, 13, 0)]
        );
        assert!(mask_spans(&[]).is_empty());
        assert_eq!(
            mask_spans(&[1]),
            [MaskSpan {
                start: 0,
                end: 1,
                mask: 1
            }]
        );
    }

    #[test]
    fn spans_decode_with_the_tokenizer_and_escape() {
        let tokenizer = Tokenizer::qwen25().unwrap();
        let prompt = tokenizer
            .encode("<|im_start|>user\nsay <b>hi</b><|im_end|>\n<|im_start|>assistant\n")
            .unwrap();
        let reply = tokenizer.encode("hi & bye<|im_end|>").unwrap();
        let tokens = [prompt.clone(), reply.clone()].concat();
        let mask = [vec![0; prompt.len()], vec![1; reply.len()]].concat();
        let html = tokens_html(
            &tokens,
            &mask,
            Some(&tokenizer),
            "the embedded Qwen2.5 tokenizer",
        );
        let first = format!(
            "<span class=\"mask-0\" title=\"tokens 0..{n} ({n}), masked\">&lt;|im_start|&gt;user\nsay &lt;b&gt;hi&lt;/b&gt;",
            n = prompt.len()
        );
        assert!(html.contains(&first), "{html}");
        assert!(
            html.contains("\">hi &amp; bye&lt;|im_end|&gt;</span>"),
            "{html}"
        );
        assert!(html.contains(&format!("{} tokens: {} trained", tokens.len(), reply.len())));
        assert!(html.contains("Decoded with the embedded Qwen2.5 tokenizer."));
    }

    #[test]
    fn without_a_tokenizer_the_ids_are_shown_and_the_page_says_why() {
        let html = tokens_html(
            &[5, 6, 7],
            &[0, 1, 1],
            None,
            "no tokenizer found (looked in X)",
        );
        assert!(html.contains("<span class=\"warning\">no tokenizer found (looked in X)</span>"));
        assert!(html.contains("title=\"tokens 0..1 (1), masked\">5 </span>"));
        assert!(html.contains("title=\"tokens 1..3 (2), trained\">6 7 </span>"));
    }
}
