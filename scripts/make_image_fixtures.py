"""Writes the image files the classifier tests read (models/tests/images/), from the
first test images of the vendored MNIST and Fashion-MNIST (stdlib only).

Each format and variation a user may give is covered: a 28x28 grey PNG, a binary
PGM (P5), a text PGM (P2), and an 84x84 RGB PNG with a dark figure on a light
background (resized and inverted by the reader). Names end in the true label.
Run from the repository root: `python3 scripts/make_image_fixtures.py`.
"""
import gzip
import os
import struct
import zlib

OUT = "models/tests/images"


def test_images(folder):
    with gzip.open(f"models/data/{folder}/t10k-images-idx3-ubyte.gz") as f:
        data = f.read()
    with gzip.open(f"models/data/{folder}/t10k-labels-idx1-ubyte.gz") as f:
        labels = f.read()[8:]
    n, rows, cols = struct.unpack(">III", data[4:16])
    pixels = data[16:]
    return [(pixels[i * rows * cols:(i + 1) * rows * cols], labels[i]) for i in range(4)]


def png(path, width, height, rows, colour):
    """rows: bytes per row (grey, or RGB when colour)."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    raw = b"".join(b"\x00" + r for r in rows)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2 if colour else 0, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def write(prefix, images):
    (a, la), (b, lb), (c, lc), (d, ld) = images
    png(f"{OUT}/{prefix}_grey_{la}.png", 28, 28, [a[r * 28:(r + 1) * 28] for r in range(28)], False)
    with open(f"{OUT}/{prefix}_binary_{lb}.pgm", "wb") as f:
        f.write(b"P5\n28 28\n255\n" + b)
    with open(f"{OUT}/{prefix}_text_{lc}.pgm", "w") as f:
        f.write("P2\n# a text PGM\n28 28\n255\n")
        for r in range(28):
            f.write(" ".join(str(v) for v in c[r * 28:(r + 1) * 28]) + "\n")
    # 3x larger, dark on light, RGB.
    rows = []
    for r in range(84):
        row = bytearray()
        for col in range(84):
            v = 255 - d[(r // 3) * 28 + col // 3]
            row += bytes([v, v, v])
        rows.append(bytes(row))
    png(f"{OUT}/{prefix}_big_inverted_{ld}.png", 84, 84, rows, True)


os.makedirs(OUT, exist_ok=True)
write("mnist", test_images("mnist"))
write("fashion", test_images("fashion-mnist"))
with open(f"{OUT}/not_an_image.png", "w") as f:
    f.write("this file only pretends to be a PNG\n")
