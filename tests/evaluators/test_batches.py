"""The batch loop's packing (`batches.pack`): any number of images goes into batches of a few fixed
widths, each padded by at most a quarter, so that a pass compiles once per width, not once per
number of images an earlier attack or round left."""

import pytest

from patjax.evaluators import batches

WIDTHS = (2, 4, 8, 16, 32, 64, 128, 250)  # batch_widths(250) on 2 devices


@pytest.mark.parametrize("num_images", [1, 2, 3, 7, 63, 65, 100, 129, 200, 249, 250, 251, 737])
def test_packing_takes_every_image_once_in_fixed_widths_with_little_padding(num_images):
    packed = batches.pack(num_images, WIDTHS)
    assert sum(images for images, _ in packed) == num_images
    for images, width in packed:
        assert width in WIDTHS and 0 < images <= width
        assert width == WIDTHS[0] or width - images <= width / 4
    # Whole batches of the largest width while more images than it are left.
    assert [w for _, w in packed[: num_images // 250]] == [250] * (num_images // 250)


def test_the_widths_are_the_batch_and_the_devices_times_powers_of_two():
    widths = batches.batch_widths(250)
    devices = widths[0]
    assert 250 % devices == 0
    assert widths == tuple(sorted({250} | {devices * 2**k for k in range(8) if devices * 2**k < 250}))
