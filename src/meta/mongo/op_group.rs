//! A group commit's queued operations on sessions and agents, planned into
//! steps: runs of one agent's link changes merged into one update each.

use crate::vocab::{AgentId, LinkId, LinkKind, OpId, Operation, UserId};

/// Connects and disconnects of one agent's list in a row, each link once.
/// One `$pullAll` and one `$addToSet` with `$each` leave the list exactly as
/// applying them one by one would: new links are appended in order, present
/// ones stay where they are. A link seen again starts a new run (removing
/// and re-adding it moves it to the end, which one update cannot express).
pub(super) struct LinkRun<'a> {
    pub(super) owner_id: &'a UserId,
    pub(super) agent_id: &'a AgentId,
    pub(super) kind: LinkKind,
    pub(super) add: Vec<&'a LinkId>,
    pub(super) remove: Vec<&'a LinkId>,
    /// Its operations in order: each link and whether it is connected.
    pub(super) ops: Vec<(&'a Operation, &'a LinkId, bool)>,
}

pub(super) enum GroupStep<'a> {
    Links(LinkRun<'a>),
    One(&'a Operation),
}

/// A group's operations, in order, with runs of link changes merged: a
/// burst on one agent costs a few statements instead of one per operation.
pub(super) fn plan_group(ops: &[(Operation, OpId)]) -> Vec<GroupStep<'_>> {
    let mut steps: Vec<GroupStep<'_>> = Vec::new();
    for (op, _) in ops {
        let Operation::Link {
            owner_id,
            agent_id,
            kind,
            link_id,
            connected,
        } = op
        else {
            steps.push(GroupStep::One(op));
            continue;
        };
        let link = link_id;
        let extends = matches!(steps.last(), Some(GroupStep::Links(run))
            if run.agent_id == agent_id
                && run.owner_id == owner_id
                && run.kind == *kind
                && !run.add.contains(&link)
                && !run.remove.contains(&link));
        if !extends {
            steps.push(GroupStep::Links(LinkRun {
                owner_id,
                agent_id,
                kind: *kind,
                add: Vec::new(),
                remove: Vec::new(),
                ops: Vec::new(),
            }));
        }
        if let Some(GroupStep::Links(run)) = steps.last_mut() {
            run.ops.push((op, link, *connected));
            match connected {
                true => run.add.push(link),
                false => run.remove.push(link),
            }
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{Container, FileId};

    /// Agents `a` and `b` of user `u`.
    fn id(name: &str) -> String {
        let n = match name {
            "u" => 1,
            "a" => 2,
            _ => 3,
        };
        format!("0190f2a0-0000-7000-8000-00000000000{n}")
    }

    fn link(agent: &str, kind: LinkKind, link: &str, connected: bool) -> (Operation, OpId) {
        let op = Operation::Link {
            owner_id: UserId::parse(&id("u")).unwrap(),
            agent_id: AgentId::parse(&id(agent)).unwrap(),
            kind,
            link_id: LinkId::parse(link).unwrap(),
            connected,
        };
        (op, OpId::new())
    }

    /// A merged run: agent (its name), list, added, removed.
    type Run = (&'static str, LinkKind, Vec<String>, Vec<String>);

    fn run(agent: &'static str, kind: LinkKind, add: &[&str], remove: &[&str]) -> Option<Run> {
        let owned = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        Some((agent, kind, owned(add), owned(remove)))
    }

    /// Each step as a run, or `None` for a single operation.
    fn shape(ops: &[(Operation, OpId)]) -> Vec<Option<Run>> {
        let names = |links: Vec<&LinkId>| links.iter().map(|l| l.as_str().to_owned()).collect();
        plan_group(ops)
            .into_iter()
            .map(|s| match s {
                GroupStep::Links(r) => {
                    let agent = if r.agent_id.to_string() == id("a") {
                        "a"
                    } else {
                        "b"
                    };
                    Some((agent, r.kind, names(r.add), names(r.remove)))
                }
                GroupStep::One(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_run_of_link_changes_merges_until_a_link_repeats_or_the_list_changes() {
        use LinkKind::{Mcp, Toolset};
        let attach = Operation::Attach {
            owner_id: UserId::parse(&id("u")).unwrap(),
            container: Container::Agent(AgentId::parse(&id("a")).unwrap()),
            file_id: FileId::new(),
            attached: true,
        };
        let ops = vec![
            link("a", Mcp, "m1", true),
            link("a", Mcp, "m2", true),
            link("a", Mcp, "m3", false),
            link("a", Mcp, "m1", false), // m1 again: a new run
            link("a", Toolset, "t1", true),
            link("b", Toolset, "t2", true),
            (attach, OpId::new()),
            link("b", Toolset, "t3", true),
        ];
        assert_eq!(
            shape(&ops),
            vec![
                run("a", Mcp, &["m1", "m2"], &["m3"]),
                run("a", Mcp, &[], &["m1"]),
                run("a", Toolset, &["t1"], &[]),
                run("b", Toolset, &["t2"], &[]),
                None,
                run("b", Toolset, &["t3"], &[]),
            ]
        );
    }
}
