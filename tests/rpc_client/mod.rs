//! A client for TVM's RPC protocol, written from docs/src/architecture/tvm-rpc.md, speaking the subset
//! TVM 0.27's Python client uses: the handshake, kInitServer, global functions, calls with the
//! 2- or 3-value return encoding, allocation, chunked copies, frees and shutdown. The tests drive
//! relaxc's server with it where TVM is not installed (and against the board servers under qemu).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use relaxc::host::{Input, Output};

pub const MAGIC: i32 = 0xFF271;
pub const KEY_MISMATCH: i32 = 0xFF273;

pub mod code {
    pub const SHUTDOWN: i32 = 1;
    pub const INIT_SERVER: i32 = 2;
    pub const CALL_FUNC: i32 = 3;
    pub const RETURN: i32 = 4;
    pub const EXCEPTION: i32 = 5;
    pub const COPY_FROM_REMOTE: i32 = 6;
    pub const COPY_TO_REMOTE: i32 = 7;
    pub const COPY_ACK: i32 = 8;
    pub const GET_GLOBAL_FUNC: i32 = 9;
    pub const FREE_HANDLE: i32 = 10;
    pub const DEV_FREE_DATA: i32 = 14;
    pub const DEV_STREAM_SYNC: i32 = 15;
    pub const DEV_ALLOC_DATA_WITH_SCOPE: i32 = 17;
}

/// A DLTensor as it travels: the server's data token, dtype (code, bits, lanes) and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct WireTensor {
    pub data: u64,
    pub dtype: (u8, u8, u16),
    pub shape: Vec<i64>,
    pub byte_offset: u64,
}

impl WireTensor {
    pub fn nbytes(&self) -> u64 {
        let bits = self.dtype.1 as u64 * self.dtype.2 as u64;
        (self.shape.iter().product::<i64>() as u64 * bits).div_ceil(8)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Int(i64),
    Bool(bool),
    Float(f64),
    Handle(u64),
    Device(i32, i32),
    Tensor(WireTensor),
    Str(String),
    ByteArray(Vec<u8>),
    /// Boxed bytes (an upload's contents).
    Bytes(Vec<u8>),
    Module(u64),
    /// A remote object passed back (RPCObjectRef).
    Object(u64),
}

/// What went wrong: the server's kException text, or the connection.
#[derive(Debug)]
pub enum RpcError {
    Remote(String),
    Io(String),
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Remote(m) => write!(f, "RPCError: {m}"),
            RpcError::Io(m) => write!(f, "connection: {m}"),
        }
    }
}

impl std::error::Error for RpcError {}

impl From<std::io::Error> for RpcError {
    fn from(e: std::io::Error) -> Self {
        RpcError::Io(e.to_string())
    }
}

type Result<T> = std::result::Result<T, RpcError>;

pub fn put_value(out: &mut Vec<u8>, v: &Value) {
    let mut tag = |t: i32| out.extend(t.to_le_bytes());
    match v {
        Value::None => tag(0),
        Value::Int(i) => {
            tag(1);
            out.extend(i.to_le_bytes());
        }
        Value::Bool(b) => {
            tag(2);
            out.extend((*b as i64).to_le_bytes());
        }
        Value::Float(f) => {
            tag(3);
            out.extend(f.to_le_bytes());
        }
        Value::Handle(h) => {
            tag(4);
            out.extend(h.to_le_bytes());
        }
        Value::Device(t, i) => {
            tag(6);
            out.extend(t.to_le_bytes());
            out.extend(i.to_le_bytes());
        }
        Value::Tensor(t) => {
            tag(7);
            put_tensor(out, t);
        }
        Value::Str(s) => {
            tag(8);
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        Value::ByteArray(b) => {
            tag(9);
            out.extend((b.len() as u64).to_le_bytes());
            out.extend(b);
        }
        Value::Bytes(b) => {
            tag(if b.len() <= 7 { 12 } else { 66 });
            out.extend(66u32.to_le_bytes());
            out.extend((b.len() as u64).to_le_bytes());
            out.extend(b);
        }
        Value::Module(h) => {
            tag(73);
            out.extend(h.to_le_bytes());
        }
        Value::Object(h) => {
            tag(115);
            out.extend(115u32.to_le_bytes());
            out.extend(h.to_le_bytes());
        }
    }
}

pub fn put_tensor(out: &mut Vec<u8>, t: &WireTensor) {
    out.extend(t.data.to_le_bytes());
    out.extend(1i32.to_le_bytes());
    out.extend(0i32.to_le_bytes());
    out.extend((t.shape.len() as i32).to_le_bytes());
    out.extend([t.dtype.0, t.dtype.1]);
    out.extend(t.dtype.2.to_le_bytes());
    for d in &t.shape {
        out.extend(d.to_le_bytes());
    }
    out.extend(t.byte_offset.to_le_bytes());
}

pub fn put_seq(out: &mut Vec<u8>, values: &[Value]) {
    out.extend((values.len() as i32).to_le_bytes());
    for v in values {
        put_value(out, v);
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if n > self.b.len() {
            return Err(RpcError::Io(format!("reply truncated: need {n} bytes, have {}", self.b.len())));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn tensor(&mut self) -> Result<WireTensor> {
        let data = self.u64()?;
        let (_device_type, _device_id, ndim) = (self.i32()?, self.i32()?, self.i32()?);
        let dt = self.take(4)?;
        let dtype = (dt[0], dt[1], u16::from_le_bytes([dt[2], dt[3]]));
        let shape = (0..ndim).map(|_| self.u64().map(|d| d as i64)).collect::<Result<Vec<_>>>()?;
        Ok(WireTensor { data, dtype, shape, byte_offset: self.u64()? })
    }
    fn value(&mut self) -> Result<Value> {
        Ok(match self.i32()? {
            0 => Value::None,
            1 => Value::Int(self.u64()? as i64),
            2 => Value::Bool(self.u64()? != 0),
            3 => Value::Float(f64::from_bits(self.u64()?)),
            4 => Value::Handle(self.u64()?),
            7 => Value::Tensor(self.tensor()?),
            8 => {
                let n = self.u64()? as usize;
                Value::Str(String::from_utf8_lossy(self.take(n)?).into_owned())
            }
            9 => {
                let n = self.u64()? as usize;
                Value::ByteArray(self.take(n)?.to_vec())
            }
            other => return Err(RpcError::Io(format!("unexpected type index {other} in a reply"))),
        })
    }
    fn seq(&mut self) -> Result<Vec<Value>> {
        let n = self.i32()?;
        (0..n).map(|_| self.value()).collect()
    }
}

pub struct Client {
    pub stream: TcpStream,
    max_packet: Option<u64>,
    upload_fn: Option<u64>,
}

/// Connects with `key` ("client:" is prepended) and initializes the session.
pub fn connect(port: u16, key: &str) -> Result<Client> {
    let mut client = handshake(port, &format!("client:{key}"))?
        .map_err(|code| RpcError::Remote(format!("the server refused the key (code 0x{code:x})")))?;
    let mut body = Vec::new();
    body.extend(5u64.to_le_bytes());
    body.extend(b"0.8.0");
    put_seq(&mut body, &[]);
    client.request(code::INIT_SERVER, &body)?;
    Ok(client)
}

/// The handshake alone: Ok(client) when accepted, Err(code) when the server answered with
/// another code.
pub fn handshake(port: u16, full_key: &str) -> Result<std::result::Result<Client, i32>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    stream.set_nodelay(true)?;
    let mut hello = Vec::new();
    hello.extend(MAGIC.to_le_bytes());
    hello.extend((full_key.len() as i32).to_le_bytes());
    hello.extend(full_key.as_bytes());
    stream.write_all(&hello)?;
    let mut code = [0u8; 4];
    stream.read_exact(&mut code)?;
    let code = i32::from_le_bytes(code);
    if code != MAGIC {
        return Ok(Err(code));
    }
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let mut key = vec![0u8; i32::from_le_bytes(len) as usize];
    stream.read_exact(&mut key)?;
    Ok(Ok(Client { stream, max_packet: None, upload_fn: None }))
}

impl Client {
    /// Sends one request and reads its reply: Ok((code, payload after the code)), or the
    /// server's exception.
    pub fn request(&mut self, code: i32, payload: &[u8]) -> Result<(i32, Vec<u8>)> {
        let mut packet = Vec::with_capacity(12 + payload.len());
        packet.extend((4 + payload.len() as u64).to_le_bytes());
        packet.extend(code.to_le_bytes());
        packet.extend(payload);
        self.stream.write_all(&packet)?;
        self.read_reply()
    }

    pub fn read_reply(&mut self) -> Result<(i32, Vec<u8>)> {
        let mut len = [0u8; 8];
        self.stream.read_exact(&mut len)?;
        let len = u64::from_le_bytes(len);
        if !(4..=1 << 30).contains(&len) {
            return Err(RpcError::Io(format!("reply of {len} bytes")));
        }
        let mut body = vec![0u8; len as usize];
        self.stream.read_exact(&mut body)?;
        let code = i32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
        let payload = body[4..].to_vec();
        if code == code::EXCEPTION {
            let mut r = Reader { b: &payload };
            return match r.seq()?.first() {
                Some(Value::Str(message)) => Err(RpcError::Remote(message.clone())),
                other => Err(RpcError::Io(format!("malformed exception {other:?}"))),
            };
        }
        Ok((code, payload))
    }

    /// A syscall (codes >= 9): its one reply value.
    pub fn syscall(&mut self, code: i32, args: &[Value]) -> Result<Value> {
        let mut body = Vec::new();
        put_seq(&mut body, args);
        let (_, reply) = self.request(code, &body)?;
        let values = Reader { b: &reply }.seq()?;
        match values.as_slice() {
            [v] => Ok(v.clone()),
            other => Err(RpcError::Io(format!("a syscall reply of {} values", other.len()))),
        }
    }

    pub fn get_global(&mut self, name: &str) -> Result<u64> {
        match self.syscall(code::GET_GLOBAL_FUNC, &[Value::Str(name.into())])? {
            Value::Handle(h) => Ok(h),
            other => Err(RpcError::Io(format!("kGetGlobalFunc answered {other:?}"))),
        }
    }

    /// kCallFunc: the reply's values (type index first, then the value, then a tensor's handle).
    pub fn call(&mut self, func: u64, args: &[Value]) -> Result<Vec<Value>> {
        let mut body = func.to_le_bytes().to_vec();
        put_seq(&mut body, args);
        let (_, reply) = self.request(code::CALL_FUNC, &body)?;
        Reader { b: &reply }.seq()
    }

    pub fn call_global(&mut self, name: &str, args: &[Value]) -> Result<Vec<Value>> {
        let f = self.get_global(name)?;
        if f == 0 {
            return Err(RpcError::Io(format!("the server has no {name}")));
        }
        let out = self.call(f, args);
        self.free(f)?;
        out
    }

    pub fn free(&mut self, handle: u64) -> Result<()> {
        self.syscall(code::FREE_HANDLE, &[Value::Handle(handle)]).map(|_| ())
    }

    pub fn upload(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let f = match self.upload_fn {
            Some(f) => f,
            None => {
                let f = self.get_global("tvm.rpc.server.upload")?;
                self.upload_fn = Some(f);
                f
            }
        };
        self.call(f, &[Value::Str(name.into()), Value::Bytes(bytes.to_vec())]).map(|_| ())
    }

    pub fn load_module(&mut self, name: &str) -> Result<u64> {
        match self.call_global("tvm.rpc.server.load_module", &[Value::Str(name.into())])?.as_slice() {
            [Value::Int(73), Value::Handle(h)] => Ok(*h),
            other => Err(RpcError::Io(format!("load_module answered {other:?}"))),
        }
    }

    /// A function of a module, or None when the module has none of that name.
    pub fn get_function(&mut self, module: u64, name: &str) -> Result<Option<u64>> {
        let args = [Value::Module(module), Value::Str(name.into()), Value::Bool(true)];
        match self.call_global("tvm.rpc.server.ModuleGetFunction", &args)?.as_slice() {
            [Value::Int(68), Value::Handle(h)] => Ok(Some(*h)),
            [Value::Int(0), Value::None] => Ok(None),
            other => Err(RpcError::Io(format!("ModuleGetFunction answered {other:?}"))),
        }
    }

    fn max_packet(&mut self) -> Result<u64> {
        if let Some(m) = self.max_packet {
            return Ok(m);
        }
        let max = match self.call_global("tvm.rpc.server.GetCRTMaxPacketSize", &[])?.as_slice() {
            [Value::Int(1), Value::Int(m)] if *m > 0 => *m as u64,
            other => return Err(RpcError::Io(format!("GetCRTMaxPacketSize answered {other:?}"))),
        };
        self.max_packet = Some(max);
        Ok(max)
    }

    /// A tensor on the server holding `data`, copied in chunks as TVM's client does.
    pub fn tensor(&mut self, dtype: (u8, u8, u16), shape: &[i64], data: &[u8]) -> Result<WireTensor> {
        let request = WireTensor { data: 0, dtype, shape: shape.to_vec(), byte_offset: 0 };
        let token =
            match self.syscall(code::DEV_ALLOC_DATA_WITH_SCOPE, &[Value::Tensor(request.clone()), Value::None])? {
                Value::Handle(h) => h,
                other => return Err(RpcError::Io(format!("alloc answered {other:?}"))),
            };
        let t = WireTensor { data: token, ..request };
        let overhead = 4 + 36 + 8 * shape.len() as u64 + 8;
        let chunk = (self.max_packet()? - overhead) as usize;
        let mut offset = 0;
        loop {
            let piece = &data[offset..(offset + chunk).min(data.len())];
            let mut body = Vec::new();
            put_tensor(&mut body, &WireTensor { byte_offset: offset as u64, ..t.clone() });
            body.extend((piece.len() as u64).to_le_bytes());
            body.extend(piece);
            self.request(code::COPY_TO_REMOTE, &body)?;
            offset += piece.len();
            if offset >= data.len() {
                break;
            }
        }
        self.syscall(code::DEV_STREAM_SYNC, &[Value::Device(1, 0), Value::Handle(0)])?;
        Ok(t)
    }

    /// A tensor's bytes, copied out in chunks.
    pub fn read(&mut self, t: &WireTensor) -> Result<Vec<u8>> {
        let total = t.nbytes() as usize;
        let overhead = 4 + 36 + 8 * t.shape.len() as u64 + 8;
        let chunk = (self.max_packet()? - overhead) as usize;
        let mut out = Vec::with_capacity(total);
        while out.len() < total || total == 0 {
            let n = chunk.min(total - out.len());
            let mut body = Vec::new();
            put_tensor(&mut body, &WireTensor { byte_offset: out.len() as u64, ..t.clone() });
            body.extend((n as u64).to_le_bytes());
            let (code, payload) = self.request(code::COPY_FROM_REMOTE, &body)?;
            if code != code::COPY_ACK || payload.len() != n {
                return Err(RpcError::Io(format!("kCopyFromRemote answered code {code} with {} bytes", payload.len())));
            }
            out.extend(payload);
            if total == 0 {
                break;
            }
        }
        Ok(out)
    }

    pub fn free_data(&mut self, t: &WireTensor) -> Result<()> {
        self.syscall(code::DEV_FREE_DATA, &[Value::Device(1, 0), Value::Handle(t.data)]).map(|_| ())
    }

    /// Arguments for a call from a fixture's inputs (tensors allocated and copied); None for an
    /// input TVM's client cannot send (a shape tuple is a local object it refuses).
    pub fn arguments(&mut self, inputs: &[Input]) -> Result<Option<(Vec<Value>, Vec<WireTensor>)>> {
        let (mut args, mut tensors) = (Vec::new(), Vec::new());
        for input in inputs {
            match input {
                Input::Tensor(t) => {
                    let wire = self.tensor((t.dtype.code, t.dtype.bits, t.dtype.lanes), &t.shape, t.data.as_slice())?;
                    tensors.push(wire.clone());
                    args.push(Value::Tensor(wire));
                }
                Input::Int(i) => args.push(Value::Int(*i)),
                Input::Float(f) => args.push(Value::Float(*f)),
                Input::Shape(_) => {
                    for t in &tensors {
                        self.free_data(t)?;
                    }
                    return Ok(None);
                }
            }
        }
        Ok(Some((args, tensors)))
    }

    /// A call's result as host values: tensors read back, tuples read with ffi.ArraySize and
    /// ffi.ArrayGetItem, shapes with relaxc's extension of them; every handle freed.
    pub fn fetch(&mut self, reply: &[Value]) -> Result<Output> {
        match reply {
            [Value::Int(0), Value::None] => Ok(Output::Other("None".into())),
            [Value::Int(1), Value::Int(v)] => Ok(Output::Int(*v)),
            [Value::Int(2), Value::Bool(v)] => Ok(Output::Bool(*v)),
            [Value::Int(3), Value::Float(v)] => Ok(Output::Float(*v)),
            [Value::Int(70), Value::Tensor(t), Value::Handle(h)] => {
                let data = self.read(t)?;
                self.free(*h)?;
                let dtype = relaxc::abi::DLDataType { code: t.dtype.0, bits: t.dtype.1, lanes: t.dtype.2 };
                Ok(Output::Tensor { dtype, shape: t.shape.clone(), data })
            }
            [Value::Int(kind @ (69 | 71)), Value::Handle(h)] => {
                let object = Value::Object(*h);
                let size = match self.call_global("ffi.ArraySize", std::slice::from_ref(&object))?.as_slice() {
                    [Value::Int(1), Value::Int(n)] => *n,
                    other => return Err(RpcError::Io(format!("ffi.ArraySize answered {other:?}"))),
                };
                let mut items = Vec::new();
                for i in 0..size {
                    let item = self.call_global("ffi.ArrayGetItem", &[object.clone(), Value::Int(i)])?;
                    items.push(self.fetch(&item)?);
                }
                self.free(*h)?;
                if *kind == 69 {
                    let dims = items.iter().map(|o| if let Output::Int(d) = o { *d } else { -1 }).collect();
                    return Ok(Output::Shape(dims));
                }
                Ok(Output::Tuple(items))
            }
            [Value::Int(index), Value::Handle(h)] => {
                self.free(*h)?;
                Ok(Output::Other(format!("type index {index}")))
            }
            other => Err(RpcError::Io(format!("unexpected return encoding {other:?}"))),
        }
    }

    /// `rmod.time_evaluator(name, dev, number, repeat, min_repeat_ms)(args)`: seconds per call,
    /// one per repeat.
    pub fn time(
        &mut self,
        module: u64,
        name: &str,
        number: i64,
        repeat: i64,
        min_repeat_ms: i64,
        args: &[Value],
    ) -> Result<Vec<f64>> {
        let settings = [number, repeat, min_repeat_ms, 100, 0, 1, 0].map(Value::Int);
        let mut timer_args = vec![Value::Module(module), Value::Str(name.into()), Value::Int(1), Value::Int(0)];
        timer_args.extend(settings);
        timer_args.push(Value::Str(String::new()));
        let timer = match self.call_global("runtime.RPCTimeEvaluator", &timer_args)?.as_slice() {
            [Value::Int(68), Value::Handle(h)] => *h,
            other => return Err(RpcError::Io(format!("RPCTimeEvaluator answered {other:?}"))),
        };
        let seconds = match self.call(timer, args)?.as_slice() {
            [Value::Int(66), Value::ByteArray(blob)] if blob.len() == 8 * repeat as usize => {
                blob.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes"))).collect()
            }
            other => return Err(RpcError::Io(format!("the timer answered {other:?}"))),
        };
        self.free(timer)?;
        Ok(seconds)
    }

    /// kShutdown (no reply), then the server closes.
    pub fn shutdown(mut self) -> Result<()> {
        let mut packet = 4u64.to_le_bytes().to_vec();
        packet.extend(code::SHUTDOWN.to_le_bytes());
        self.stream.write_all(&packet)?;
        let mut rest = Vec::new();
        self.stream.read_to_end(&mut rest)?;
        if !rest.is_empty() {
            return Err(RpcError::Io(format!("{} bytes after kShutdown", rest.len())));
        }
        Ok(())
    }
}
