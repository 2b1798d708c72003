"""Log-log line charts as SVG, standard library only: the panels, reference lines and legends that
bench/coll_summary.py, bench/torch_bench.py and bench/cluster_bench.py draw (busbw against size).

    parts = panel(0, 0, 330, 240, [Line([(8, 1e-4), (1 << 20, 1.2)], "#d62728")], title="allreduce, 2 ranks",
                  rules=[Rule(5.0, "bound")])
    write("busbw.svg", 330, 270, parts + legend(10, 258, [("topocoll", "#d62728", "")]))

x is a size in bytes (ticks labelled by human()), y a rate; both axes are logarithmic: y in whole decades that cover
the points and the rules (marked at 1, 2 and 5 when they are two or fewer), x from the smallest size to the largest
(a single size sits in the middle).
"""
import collections
import math
from xml.sax.saxutils import escape

# points: [(x, y)], y > 0 (others are left out); dash: SVG stroke-dasharray ("" solid); markers: a dot per point.
Line = collections.namedtuple("Line", "points color dash width markers", defaults=("", 1.6, True))
# A horizontal reference at y (a bound, a link's rate): dashed, its label above its right end.
Rule = collections.namedtuple("Rule", "y label color dash", defaults=("", "#7f7f7f", "4 3"))


def human(size, sep=""):
    """8 -> '8', 1048576 -> '1M' (sep " ": '1 M'); only whole multiples of K, M, G."""
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= f and size % f == 0:
            return f"{size // f}{sep}{unit}"
    return str(size)


def _decades(values):
    lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)) - 1e-9)
    return lo, max(hi, lo + 1)


def panel(x0, y0, w, h, lines, *, title="", rules=(), xticks=None, xfmt=human, yfmt="{:g}".format,
          xlabel="size (B)", ylabel="busbw (GB/s)", margins=(52, 10, 26, 36), title_size=12):
    """The SVG elements of one log-log panel whose box is (x0, y0, w, h); margins (left, right, top, bottom) hold
    the title, the ticks and the axis labels. xticks: the sizes to label (default every size of a point). [] when no
    line has a point."""
    L, R, T, B = margins
    lines = [l._replace(points=[(x, y) for x, y in l.points if x > 0 and y > 0]) for l in lines]
    xs = [x for l in lines for x, _ in l.points]
    if not xs:
        return []
    xl, xh = math.log10(min(xs)), math.log10(max(xs))
    if xh - xl < 1e-9:  # one size: in the middle
        xl, xh = xl - 0.5, xh + 0.5
    yl, yh = _decades([y for l in lines for _, y in l.points] + [r.y for r in rules if r.y > 0])
    px = lambda x: x0 + L + (math.log10(x) - xl) / (xh - xl) * (w - L - R)
    py = lambda y: y0 + h - B - (math.log10(y) - yl) / (yh - yl) * (h - T - B)
    o = []
    if title:
        o.append(f'<text x="{x0 + w / 2:.1f}" y="{y0 + T - 10}" text-anchor="middle" font-size="{title_size}">'
                 f'{escape(title)}</text>')
    o.append(f'<rect x="{x0 + L}" y="{y0 + T}" width="{w - L - R}" height="{h - T - B}" fill="none" stroke="#999"/>')
    steps = (1, 2, 5) if yh - yl <= 2 else (1,)  # a short axis: also 2 and 5 times each decade
    for v in [m * 10.0 ** e for e in range(yl, yh + 1) for m in steps if m * 10.0 ** e <= 10.0 ** yh]:
        y = py(v)
        o.append(f'<line x1="{x0 + L}" x2="{x0 + w - R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        o.append(f'<text x="{x0 + L - 4}" y="{y + 3:.1f}" text-anchor="end">{escape(yfmt(v))}</text>')
    for s in sorted(set(xs) if xticks is None else xticks):
        o.append(f'<text x="{px(s):.1f}" y="{y0 + h - B + 12}" text-anchor="middle">{escape(xfmt(s))}</text>')
    if xlabel:
        o.append(f'<text x="{x0 + L + (w - L - R) / 2:.1f}" y="{y0 + h - 8}" text-anchor="middle">{escape(xlabel)}'
                 f'</text>')
    if ylabel:
        o.append(f'<text x="{x0 + 12}" y="{y0 + h / 2:.1f}" transform="rotate(-90 {x0 + 12} {y0 + h / 2:.1f})" '
                 f'text-anchor="middle">{escape(ylabel)}</text>')
    for r in rules:
        if r.y <= 0:
            continue
        y = py(r.y)
        o.append(f'<line x1="{x0 + L}" x2="{x0 + w - R}" y1="{y:.1f}" y2="{y:.1f}" stroke="{r.color}"'
                 f'{_dash(r.dash)}/>')
        if r.label:
            o.append(f'<text x="{x0 + w - R - 3}" y="{y - 3:.1f}" text-anchor="end" fill="{r.color}">'
                     f'{escape(r.label)}</text>')
    for l in lines:
        if len(l.points) > 1:
            d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in l.points)
            o.append(f'<polyline points="{d}" fill="none" stroke="{l.color}" stroke-width="{l.width}"'
                     f'{_dash(l.dash)}/>')
        if l.markers or len(l.points) == 1:
            o.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2" fill="{l.color}"/>' for x, y in l.points)
    return o


def legend(x, y, items, vertical=False):
    """A key at (x, y), the baseline of its first row: items (label, color, dash[, width]) side by side (vertical:
    one under the other), each a short line in its style and its label."""
    o = []
    for label, color, dash, *width in items:
        o.append(f'<line x1="{x}" x2="{x + 20}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" '
                 f'stroke-width="{width[0] if width else 2}"{_dash(dash)}/><text x="{x + 24}" y="{y}">{escape(label)}'
                 f'</text>')
        if vertical:
            y += 14
        else:
            x += 40 + 7 * len(label)
    return o


def _dash(dash):
    return f' stroke-dasharray="{dash}"' if dash else ""


def document(width, height, parts, font_size=10):
    """The SVG text: a white page of width x height holding parts."""
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                      f'font-family="sans-serif" font-size="{font_size}">',
                      f'<rect width="{width}" height="{height}" fill="white"/>', *parts, "</svg>"]) + "\n"


def write(path, width, height, parts, font_size=10):
    with open(path, "w") as f:
        f.write(document(width, height, parts, font_size))
