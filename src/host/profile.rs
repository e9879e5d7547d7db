//! A profiler on the instrument hook of models built with `--instrument`: per-callee counts and
//! times, the VM's own overhead, and a Chrome trace-event file (`relaxc run --profile`,
//! `--trace`). The hook is the same in bytecode and compiled code, so both modes profile alike.

use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::time::{Duration, Instant};

use crate::abi::{Any, TYPE_FUNCTION};

/// What a callee is: a kernel, a runtime builtin, or a Relax function (whose time includes its
/// own callees').
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Kernel,
    Builtin,
    Function,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kernel => "kernel",
            Kind::Builtin => "builtin",
            Kind::Function => "function",
        }
    }
}

#[derive(Clone, Debug)]
pub struct CalleeStats {
    pub kind: Kind,
    pub calls: u64,
    pub total: Duration,
}

/// One slice of the trace: a call of `name` at `start` (from the profile's origin) for `dur`.
#[derive(Clone, Debug)]
pub struct Event {
    pub name: String,
    pub kind: Kind,
    pub start: Duration,
    pub dur: Duration,
    pub depth: usize,
}

/// A slice as the hook records it: the name stays the runtime's pointer until the end, so that
/// recording allocates nothing per call.
struct RawEvent {
    name: usize,
    start: Duration,
    dur: Duration,
    depth: usize,
}

/// What the hook records. Pass `as_self()` with [`hook`] to `Vm::set_instrument`.
pub struct Profiler {
    origin: Instant,
    open: Vec<Instant>,
    /// By the address of the callee's name (stable: the program's table owns it).
    by_name: HashMap<usize, (String, CalleeStats)>,
    raw: Option<Vec<RawEvent>>,
    pub stats: HashMap<String, CalleeStats>,
    pub events: Option<Vec<Event>>,
}

impl Profiler {
    pub fn new(trace: bool) -> Profiler {
        Profiler {
            origin: Instant::now(),
            open: Vec::new(),
            by_name: HashMap::new(),
            raw: trace.then(Vec::new),
            stats: HashMap::new(),
            events: None,
        }
    }

    /// Turns what the hook recorded into `stats` and `events` (call once profiling is over).
    pub fn finish(&mut self) {
        self.stats = self.by_name.values().map(|(n, s)| (n.clone(), s.clone())).collect();
        if let Some(raw) = &self.raw {
            let events = raw
                .iter()
                .map(|e| {
                    let (name, s) = &self.by_name[&e.name];
                    Event { name: name.clone(), kind: s.kind, start: e.start, dur: e.dur, depth: e.depth }
                })
                .collect();
            self.events = Some(events);
        }
    }

    pub fn as_self(&mut self) -> *mut c_void {
        self as *mut Profiler as *mut c_void
    }

    /// Time since the profile began (for slices of whole calls, which the host times itself).
    pub fn since_origin(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.origin)
    }

    fn before(&mut self) {
        self.open.push(Instant::now());
    }

    fn after(&mut self, name: usize, describe: impl FnOnce() -> (String, Kind)) {
        let end = Instant::now();
        let Some(start) = self.open.pop() else { return };
        let dur = end - start;
        let (_, s) = self.by_name.entry(name).or_insert_with(|| {
            let (n, kind) = describe();
            (n, CalleeStats { kind, calls: 0, total: Duration::ZERO })
        });
        s.calls += 1;
        s.total += dur;
        if let Some(raw) = &mut self.raw {
            raw.push(RawEvent { name, start: start - self.origin, dur, depth: self.open.len() });
        }
    }

    /// Time spent in kernels: everything but the VM's own work.
    pub fn kernel_time(&self) -> Duration {
        self.stats.values().filter(|s| s.kind == Kind::Kernel).map(|s| s.total).sum()
    }

    /// Callees sorted by total time, largest first.
    pub fn sorted(&self) -> Vec<(&String, &CalleeStats)> {
        let mut v: Vec<_> = self.stats.iter().collect();
        v.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(b.0)));
        v
    }
}

/// The instrument hook: `args` are (callee, name, before, result, call arguments...).
///
/// # Safety
/// `self_` must be a live `Profiler` (from `as_self`), and the arguments as rvm.h describes.
pub unsafe extern "C" fn hook(self_: *mut c_void, args: *const Any, n: i32, result: *mut Any) -> i32 {
    // SAFETY: the caller passes our Profiler and n >= 4 valid arguments.
    let (profiler, args) =
        unsafe { (&mut *(self_ as *mut Profiler), std::slice::from_raw_parts(args, n.max(0) as usize)) };
    if args.len() >= 3 {
        if args[2].payload != 0 {
            profiler.before();
        } else {
            let callee_type = args[0].type_index;
            profiler.after(args[1].payload as usize, || {
                // SAFETY: the name is a NUL-terminated string the program's table owns.
                let name = unsafe { CStr::from_ptr(args[1].payload as *const std::ffi::c_char) }
                    .to_string_lossy()
                    .into_owned();
                let kind = if callee_type != TYPE_FUNCTION {
                    Kind::Function
                } else if name.starts_with("vm.builtin.") {
                    Kind::Builtin
                } else {
                    Kind::Kernel
                };
                (name, kind)
            });
        }
    }
    // SAFETY: result is a valid out-slot; 0 means "run the call".
    unsafe { *result = Any::int(0) };
    0
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The Chrome trace-event JSON (chrome://tracing, Perfetto) of the recorded slices plus the
/// whole calls given as (name, start, duration).
pub fn trace_json(events: &[Event], calls: &[(String, Duration, Duration)]) -> String {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mut items = Vec::new();
    for (name, start, dur) in calls {
        items.push(format!(
            "{{\"name\":{},\"cat\":\"call\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":1,\"tid\":1}}",
            json_string(name),
            us(*start),
            us(*dur)
        ));
    }
    for e in events {
        items.push(format!(
            "{{\"name\":{},\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":1,\"tid\":1,\"args\":{{\"depth\":{}}}}}",
            json_string(&e.name),
            e.kind.name(),
            us(e.start),
            us(e.dur),
            e.depth + 1
        ));
    }
    format!("{{\"traceEvents\":[\n{}\n],\"displayTimeUnit\":\"ns\"}}\n", items.join(",\n"))
}
