"""Draws the loss curves of a cten-train-lm run and of its PyTorch twin into a PNG, with the
standard library only (no plotting package on the development machine): training loss as thin
lines, validation loss as thick ones; cten blue, PyTorch red. x: step, from 0 to the last; y:
loss, from 0 to the largest logged (grid lines at every whole loss and every tenth of the steps).

  python3 examples/reference/lm_curves.py cten.log torch.log out.png"""
import re
import struct
import sys
import zlib

W, H, M = 800, 500, 40


def curves(path):
    train, val = [], []
    for line in open(path):
        m = re.match(r"step\s+(\d+)/\d+\s+loss ([\d.]+)", line)
        if m:
            train.append((int(m[1]), float(m[2])))
        m = re.match(r"step\s+(\d+)/\d+\s+validation loss ([\d.]+)", line)
        if m:
            val.append((int(m[1]), float(m[2])))
    return train, val


def main():
    a, b, out = sys.argv[1:4]
    ours, theirs = curves(a), curves(b)
    pts = [p for c in ours + theirs for p in c]
    xmax = max(x for x, _ in pts)
    ymax = max(y for _, y in pts)
    px = [[(255, 255, 255)] * W for _ in range(H)]

    def to_xy(x, y):
        return M + (W - 2 * M) * x / xmax, H - M - (H - 2 * M) * y / ymax

    def dot(x, y, c, r):
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                i, j = int(y) + dy, int(x) + dx
                if 0 <= i < H and 0 <= j < W:
                    px[i][j] = c

    def line(p, q, c, r):
        (x0, y0), (x1, y1) = to_xy(*p), to_xy(*q)
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for k in range(n + 1):
            dot(x0 + (x1 - x0) * k / n, y0 + (y1 - y0) * k / n, c, r)

    grey = (220, 220, 220)
    for k in range(int(ymax) + 1):
        line((0, k), (xmax, k), grey, 0)
    for k in range(11):
        line((xmax * k / 10, 0), (xmax * k / 10, ymax), grey, 0)
    line((0, 0), (xmax, 0), (0, 0, 0), 0)
    line((0, 0), (0, ymax), (0, 0, 0), 0)
    for (train, val), col in ((theirs, (220, 40, 40)), (ours, (30, 80, 220))):
        for p, q in zip(train, train[1:]):
            line(p, q, col, 0)
        for p, q in zip(val, val[1:]):
            line(p, q, col, 2)
        for p in val:
            dot(*to_xy(*p), col, 4)
    raw = b"".join(b"\x00" + bytes(v for pix in row for v in pix) for row in px)

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) +
           chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    open(out, "wb").write(png)


if __name__ == "__main__":
    main()
