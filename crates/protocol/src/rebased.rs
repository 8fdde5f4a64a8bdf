//! A reader whose usage starts from a baseline (#13): Claude Code and Codex report the usage
//! of a resumed session cumulatively, over every process that ran in it (Claude Code's
//! `modelUsage` and `total_cost_usd`, Codex's `turn.completed` thread totals), so an attempt
//! that continues a session would count its predecessors' tokens again. [`rebased`] takes the
//! usage those predecessors were journaled with off every reading: tokens and cost, field by
//! field and never below zero; turns and the context size are the process's own and stay.

use sortie_core::{Cost, Usage};

use crate::{Exit, Finished, Progress, ProtocolReader, RunPhase};

/// `inner`, with `base` taken off every usage it reports.
pub fn rebased(inner: Box<dyn ProtocolReader>, base: Usage) -> Box<dyn ProtocolReader> {
    Box::new(Rebased { inner, base })
}

struct Rebased {
    inner: Box<dyn ProtocolReader>,
    base: Usage,
}

/// `usage` less `base` (tokens and cost; turns and context size kept).
fn less(usage: &Usage, base: &Usage) -> Usage {
    Usage {
        input: usage.input.saturating_sub(base.input),
        output: usage.output.saturating_sub(base.output),
        cache_read: usage.cache_read.saturating_sub(base.cache_read),
        cache_write: usage.cache_write.saturating_sub(base.cache_write),
        reasoning: usage.reasoning.saturating_sub(base.reasoning),
        cost: Cost {
            nanos: usage.cost.nanos.saturating_sub(base.cost.nanos),
            unreported: usage.cost.unreported,
        },
        turns: usage.turns,
        context_tokens: usage.context_tokens,
    }
}

impl ProtocolReader for Rebased {
    fn seed(&mut self, usage: Usage) {
        self.inner.seed(usage);
    }

    fn line(&mut self, line: &str) -> Option<Progress> {
        self.inner.line(line).map(|mut p| {
            p.usage = less(&p.usage, &self.base);
            p
        })
    }

    fn finish(self: Box<Self>, exit: Exit, stderr_tail: &str) -> Finished {
        let mut finished = self.inner.finish(exit, stderr_tail);
        finished.usage = less(&finished.usage, &self.base);
        finished
    }

    fn parse_errors(&self) -> u64 {
        self.inner.parse_errors()
    }

    fn run_phase(&self) -> RunPhase {
        self.inner.run_phase()
    }

    fn session(&self) -> Option<&str> {
        self.inner.session()
    }

    // The answer a structured-output check reads is the wrapped reader's.
    fn answer(&self) -> Option<String> {
        self.inner.answer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::Protocol;

    #[test]
    fn a_resumed_codex_thread_counts_only_its_own_tokens() {
        // The second process of a thread: codex reports the thread's totals.
        let base = Usage {
            input: 100,
            cache_read: 50,
            output: 12,
            reasoning: 4,
            ..Usage::ZERO
        };
        let mut r = rebased(crate::reader_for(Protocol::CodexJson), base);
        for line in [
            r#"{"type":"thread.started","thread_id":"th-1"}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.completed","item":{"id":"i","type":"agent_message","text":"Hi."}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":300,"cached_input_tokens":100,"output_tokens":24,"reasoning_output_tokens":8}}"#,
        ] {
            r.line(line);
        }
        assert_eq!(r.session(), Some("th-1"));
        let f = r.finish(Exit::Code(0), "");
        assert_eq!(
            (
                f.usage.input,
                f.usage.cache_read,
                f.usage.output,
                f.usage.reasoning
            ),
            (100, 50, 12, 4)
        );
        assert_eq!(f.usage.turns, 1);
        assert_eq!(f.outcome.status, sortie_core::AttemptStatus::Completed);
    }
}
