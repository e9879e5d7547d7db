"""The convolution and pooling anchors of relaxc.tvm's rewrite (a mixin of its planner, which
supplies the bindings, the epilogue absorption and the replacement): NCHW conv2d (depthwise
included; batch norm folded into the weights, which are packed into the kernels' layouts), NCW
conv1d on the same kernels, nearest and bilinear resize2d,
conv2d_transpose (IOHW weights as ONNX holds them), and max, average and global pooling."""

import numpy as np

from tvm import relax

from .pack import pack_conv, pack_conv_columns
from .patterns import _attr, _dims, _ints, _is_f32_tensor


class ConvolutionAnchors:
    """Anchors for the planner: each method is called with a binding's variable and call."""

    def _conv_operands(self, var, call, data_layout, kernel_layout):
        """A float32 convolution's input, constant weights and dims in the given layouts, or None."""
        x, w = call.args[0], call.args[1]
        if not (_is_f32_tensor(x) and _is_f32_tensor(var)):
            return None
        if (
            _attr(call, "data_layout") != data_layout
            or _attr(call, "kernel_layout") != kernel_layout
            or _attr(call, "out_layout", data_layout) != data_layout
        ):
            return None
        weight = self.b.const(w)
        dx, dout = _dims(x), _dims(var)
        if weight is None or weight.dtype != np.float32 or dx is None or dout is None or not isinstance(dx[1], int):
            return None
        return x, weight, dx, dout

    def conv2d(self, var, call):
        operands = self._conv_operands(var, call, "NCHW", "OIHW")
        if operands is None:
            return
        x, weight, dx, dout = operands
        groups = int(_attr(call, "groups", 1))
        strides, dilation = _ints(_attr(call, "strides")), _ints(_attr(call, "dilation"))
        padding = _ints(_attr(call, "padding"))
        if len(padding) == 2:
            padding = padding * 2
        oc, _, kh, kw = weight.shape
        tail, ep = self._absorb("conv", var, dout)
        bias = ep.bias
        if ep.bn is not None:
            gamma, beta, mean, variance = (np.asarray(p, np.float64) for p in ep.bn[:4])
            eps = ep.bn[4]
            scale = gamma / np.sqrt(variance + eps)
            weight = (weight.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
            base = np.zeros(oc) if bias is None else bias.astype(np.float64)
            bias = ((base - mean) * scale + beta).astype(np.float32)
        params = [
            kh,
            kw,
            strides[0],
            strides[1],
            padding[0],
            padding[1],
            padding[2],
            padding[3],
            dilation[0],
            dilation[1],
            groups,
        ]
        depthwise = groups == dx[1] and groups == oc and weight.shape[1] == 1
        kernel = "relaxc.conv2d_depthwise" if depthwise else "relaxc.conv2d"
        # Few output pixels, more channels and a long reduction (ResNet's last stage: 7 x 7 pixels,
        # 256 channels, 2304 products each): channels become the GEMM's 16-wide columns and pixels
        # its 6-high rows, where that wastes fewer lanes than panels of 16 pixels would (49
        # pixels: 91% of 6-pixel strips used, 77% of 16-pixel panels; Zen 5, 256 -> 256 3x3: 291
        # against 363 us). With a short reduction (a MobileNet's 1x1 expansions at 12 x 12)
        # gathering pixels as rows costs more than the padding saves (2x slower), but not on the
        # smallest planes (3 x 3, 80 -> 480: 23 against 13 us); at 169 or 196 pixels both waste
        # little and pixels as columns are as fast or faster.
        pixels = dout[2] * dout[3] if isinstance(dout[2], int) and isinstance(dout[3], int) else None
        reduction = int(np.prod(weight.shape[1:]))
        if depthwise:
            w_arg = relax.const(np.ascontiguousarray(weight))
        elif (
            pixels is not None
            and pixels < oc // groups
            and (reduction >= 256 or pixels < 64)
            and pixels / (-(-pixels // 6) * 6) > pixels / (-(-pixels // 16) * 16) + 0.05
        ):
            w_arg = relax.const(pack_conv_columns(weight, groups))
        else:
            w_arg = relax.const(pack_conv(weight, groups))
        ep.bias = bias
        self._finish_conv(tail, kernel, x, w_arg, ep, params)

    def conv1d(self, var, call):
        """NCW conv1d (audio front ends, 1-D CNNs) as relaxc.conv2d or relaxc.conv2d_depthwise
        over NCW tensors, which the kernels see as NCHW with H = 1: the weights [O, I, W] become
        [O, I, 1, W] and the params those of a 1 x W kernel."""
        operands = self._conv_operands(var, call, "NCW", "OIW")
        if operands is None:
            return
        x, weight, dx, dout = operands
        groups = int(_attr(call, "groups", 1))
        stride, dilation = _ints(_attr(call, "strides"))[0], _ints(_attr(call, "dilation"))[0]
        padding = _ints(_attr(call, "padding"))
        if len(padding) == 1:
            padding = padding * 2
        oc, _, kw = weight.shape
        weight = weight.reshape(oc, weight.shape[1], 1, kw)
        tail, ep = self._absorb("conv", var, dout)
        bias = ep.bias
        if ep.bn is not None:
            return  # batch norm over NCW: left to TVM (no exporter seen writes it after a Conv1d)
        params = [1, kw, 1, stride, 0, padding[0], 0, padding[1], 1, dilation, groups]
        depthwise = groups == dx[1] and groups == oc and weight.shape[1] == 1
        if depthwise:
            kernel, w_arg = "relaxc.conv2d_depthwise", relax.const(np.ascontiguousarray(weight))
        else:
            kernel, w_arg = "relaxc.conv2d", relax.const(pack_conv(weight, groups))
        ep.bias = bias
        self._finish_conv(tail, kernel, x, w_arg, ep, params)

    def _finish_conv(self, tail, kernel, x, w_arg, ep, params):
        """A convolution kernel's call: (x, w, bias?, residual?, params, act, [alpha, lo, hi])."""
        args = [
            x,
            w_arg,
            self._bias_arg(ep),
            self._residual_arg(ep),
            relax.ShapeExpr(params),
            relax.expr.String(ep.act),
            ep.scalars(),
        ]
        self._finish(tail, kernel, args)

    def conv2d_transpose(self, var, call):
        """NCHW transposed convolution (IOHW weights, as ONNX's ConvTranspose imports): the
        weights go to relaxc.conv2d_transpose as they are (batch norm folded in when they are a
        constant), its bias, residual and activation taken into its epilogue."""
        x, w = call.args[0], call.args[1]
        if not (_is_f32_tensor(x) and _is_f32_tensor(var) and _is_f32_tensor(w)):
            return
        if (
            _attr(call, "data_layout") != "NCHW"
            or _attr(call, "kernel_layout") != "IOHW"
            or _attr(call, "out_layout", "NCHW") != "NCHW"
        ):
            return
        dx, dout, dw = _dims(x), _dims(var), _dims(w)
        if dx is None or dout is None or dw is None or not all(isinstance(d, int) for d in dw):
            return
        groups = int(_attr(call, "groups", 1))
        strides, dilation = _ints(_attr(call, "strides")), _ints(_attr(call, "dilation"))
        padding = _ints(_attr(call, "padding"))
        if len(padding) == 2:
            padding = padding * 2
        cin, cg_out, kh, kw = dw
        weight = self.b.const(w)
        tail, ep = self._absorb("conv", var, dout)
        bias, w_arg = ep.bias, w
        if ep.bn is not None:
            if weight is None:
                return  # planned with a batch norm only a constant weight can take
            gamma, beta, mean, variance = (np.asarray(p, np.float64) for p in ep.bn[:4])
            scale = gamma / np.sqrt(variance + ep.bn[4])
            # Input channel ci of group g feeds output channels g * cg_out + [0, cg_out).
            group_of = np.arange(cin) // (cin // groups)
            per = scale[group_of[:, None] * cg_out + np.arange(cg_out)[None, :]]
            weight = (weight.astype(np.float64) * per[:, :, None, None]).astype(np.float32)
            base = np.zeros(cg_out * groups) if bias is None else bias.astype(np.float64)
            bias = ((base - mean) * scale + beta).astype(np.float32)
            w_arg = relax.const(np.ascontiguousarray(weight))
        elif weight is not None:
            w_arg = relax.const(np.ascontiguousarray(weight))
        ep.bias = bias
        params = [kh, kw, strides[0], strides[1], *padding, dilation[0], dilation[1], groups]
        self._finish_conv(tail, "relaxc.conv2d_transpose", x, w_arg, ep, params)

    # What relaxc.resize2d computes as TVM's resize2d does (cubic and tf_crop_and_resize stay on
    # TVM's kernels).
    RESIZE_METHODS = ("nearest_neighbor", "linear")
    RESIZE_MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel", "tf_half_pixel_for_nn")
    RESIZE_ROUNDINGS = ("", "round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")

    def resize2d(self, var, call):
        """NCHW float32 resize2d with static output extents, nearest or bilinear."""
        x = call.args[0]
        if not (_is_f32_tensor(x) and _is_f32_tensor(var)):
            return
        dx, dout = _dims(x), _dims(var)
        if dx is None or dout is None or len(dx) != 4 or not all(isinstance(d, int) for d in dout):
            return
        method, mode = str(_attr(call, "method")), str(_attr(call, "coordinate_transformation_mode"))
        rounding = str(_attr(call, "rounding_method", ""))
        if _attr(call, "layout", "NCHW") != "NCHW" or str(_attr(call, "out_dtype", "") or "") not in ("", "float32"):
            return
        if method not in self.RESIZE_METHODS or mode not in self.RESIZE_MODES or rounding not in self.RESIZE_ROUNDINGS:
            return
        args = [x, relax.expr.String(method), relax.expr.String(mode), relax.expr.String(rounding)]
        self._finish(var, "relaxc.resize2d", args)

    def pool(self, var, call, name):
        x = call.args[0]
        if not (_is_f32_tensor(x) and _is_f32_tensor(var)) or _dims(x) is None or len(_dims(x)) != 4:
            return
        if _attr(call, "layout", "NCHW") != "NCHW" or _attr(call, "out_layout", "NCHW") != "NCHW":
            return
        if name == "relax.nn.adaptive_avg_pool2d":
            size = _attr(call, "output_size")
            if size is None or _ints(size) not in ([1, 1], [1]):
                return
            self._finish(var, "relaxc.global_avg_pool2d", [x])
            return
        if _attr(call, "ceil_mode", False):
            return
        k, s, d = _ints(_attr(call, "pool_size")), _ints(_attr(call, "strides")), _ints(_attr(call, "dilation"))
        p = _ints(_attr(call, "padding"))
        if len(p) == 2:
            p = p * 2
        params = relax.ShapeExpr([k[0], k[1], s[0], s[1], p[0], p[1], p[2], p[3], d[0], d[1]])
        if name == "relax.nn.max_pool2d":
            self._finish(var, "relaxc.max_pool2d", [x, params])
        else:
            include = int(bool(_attr(call, "count_include_pad", False)))
            self._finish(var, "relaxc.avg_pool2d", [x, params, relax.prim_value(include)])
