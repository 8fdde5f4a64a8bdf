//! `[agents.NAME]`: the file's agent profiles, merged over the built-ins.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use sortie_core::{AgentProfile, Protocol};

use crate::error::Issues;
use crate::fields::{
    AGENT_FIELDS, boolean, env_table, expected, sandbox, string, strings, suggest,
};
use crate::value::{Entry, Val};

/// User agent profiles merged over the built-ins.
pub(crate) struct Agents {
    /// The profiles by name: the built-ins, then the file's.
    pub(crate) profiles: BTreeMap<String, AgentProfile>,
    /// Each file profile's `env` (values: never journaled), sorted by name.
    pub(crate) env: HashMap<String, Vec<(String, crate::EnvValue)>>,
    /// Profiles with a problem already reported.
    pub(crate) failed: HashSet<String>,
    /// #34: a profile's own `sandbox`, the default of the tasks that run it (not journaled:
    /// each task's resolved `sandbox` is).
    pub(crate) sandbox: HashMap<String, sortie_core::sandbox::Sandbox>,
}

impl Default for Agents {
    fn default() -> Self {
        Agents {
            profiles: AgentProfile::builtins(),
            env: HashMap::new(),
            failed: HashSet::new(),
            sandbox: HashMap::new(),
        }
    }
}

impl Agents {
    /// `[agents.NAME]` tables. A profile named like a built-in starts from the built-in, so
    /// `[agents.pi] env = { ... }` only adds environment; a new profile needs a `command`.
    pub(crate) fn parse(e: &Entry, file: &Path, issues: &mut Issues) -> Agents {
        let mut agents = Agents::default();
        let Val::Table(profiles) = &e.val else {
            issues.add(
                file,
                e.line,
                Some("agents"),
                expected("a table of profiles", &e.val),
            );
            return agents;
        };
        for pe in profiles {
            let name = pe.key.clone();
            let at = |k: &str| format!("agents.{name}.{k}");
            let Val::Table(keys) = &pe.val else {
                issues.add(
                    file,
                    pe.line,
                    Some(&format!("agents.{name}")),
                    expected("a table", &pe.val),
                );
                agents.failed.insert(name);
                continue;
            };
            let builtin = AgentProfile::builtins().remove(&name);
            let is_new = builtin.is_none();
            let mut p = builtin.unwrap_or_else(|| AgentProfile {
                name: name.clone(),
                command: vec![],
                model_args: vec![],
                protocol: Protocol::Plain,
                env_keys: vec![],
                can_steer: false,
                can_continue: false,
                // Unknown agents may write: the safe assumption for retries.
                may_write: true,
                supervise: true,
            });
            let mut env = Vec::new();
            let mut bad = name.is_empty();
            if name.is_empty() {
                issues.add(
                    file,
                    pe.line,
                    Some("agents"),
                    "a profile name must not be empty",
                );
            }
            let mut has_command = false;
            for k in keys {
                if matches!(k.val, Val::Null) {
                    continue;
                }
                let parsed = match k.key.as_str() {
                    "command" => strings(&k.val).and_then(|c| {
                        has_command = true;
                        if c.is_empty() {
                            Err("must not be empty: the first element is the program".into())
                        } else {
                            p.command = c;
                            Ok(())
                        }
                    }),
                    "model_args" => strings(&k.val).map(|a| p.model_args = a),
                    "protocol" => string(&k.val).and_then(|s| {
                        Protocol::parse(&s)
                            .map(|proto| p.protocol = proto)
                            .ok_or_else(|| {
                                format!(
                                    "unknown protocol {s:?}; expected plain, pi-json, \
                                 pi-rpc, claude-stream-json or codex-json"
                                )
                            })
                    }),
                    "env" => env_table(k, file, &at("env"), issues).map(|e| env = e),
                    "can_steer" => boolean(&k.val).map(|b| p.can_steer = b),
                    "can_continue" => boolean(&k.val).map(|b| p.can_continue = b),
                    "may_write" => boolean(&k.val).map(|b| p.may_write = b),
                    "supervise" => boolean(&k.val).map(|b| p.supervise = b),
                    // #34: the default of the tasks that run it.
                    "sandbox" => sandbox(&k.val).map(|m| {
                        agents.sandbox.insert(name.clone(), m);
                    }),
                    other => Err(format!("unknown field{}", suggest(other, AGENT_FIELDS))),
                };
                if let Err(message) = parsed {
                    issues.add(file, k.line, Some(&at(&k.key)), message);
                    bad = true;
                }
            }
            if is_new && !has_command {
                issues.add(
                    file,
                    pe.line,
                    Some(&at("command")),
                    "missing: a new agent profile needs a `command` (an argv template)",
                );
                bad = true;
            }
            env.sort();
            env.dedup_by(|a, b| a.0 == b.0);
            p.env_keys = env.iter().map(|(k, _)| k.clone()).collect();
            if bad {
                agents.failed.insert(name.clone());
            }
            agents.env.insert(name.clone(), env);
            agents.profiles.insert(name, p);
        }
        agents
    }
}
