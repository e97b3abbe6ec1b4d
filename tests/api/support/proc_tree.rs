//! A process tree read from `/proc`: what a test started, found by its
//! parent's PID (a start script's children), so that it kills only those.

/// Every process under `pid`, read from `/proc`.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parents: Vec<(i32, i32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(ppid) = stat(p).map(|(_, ppid)| ppid) {
            parents.push((p, ppid));
        }
    }
    let mut found = vec![pid];
    let mut at = 0;
    while at < found.len() {
        let parent = found[at];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        at += 1;
    }
    found.remove(0);
    found
}

/// A process's state letter and parent, from `/proc/PID/stat`.
fn stat(pid: i32) -> Option<(char, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (comm) S PPID ...": comm may hold spaces, so after the last ')'.
    let mut fields = text[text.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// A process's command name (`/proc/PID/comm`), as `beam.smp`.
pub fn comm(pid: i32) -> Option<String> {
    let c = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(c.trim_end().to_owned())
}

/// Whether `pid` runs (a zombie, dead but not yet reaped, does not).
pub fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}
