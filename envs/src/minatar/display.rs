//! MinAtar's picture of a state, as its own GUI draws it: each cell one colour, that of
//! the highest channel set there (`np.amax(state * (arange(C) + 1), 2)`), black where no
//! channel is set, the channels' colours being seaborn's "cubehelix" palette of C
//! colours.

use crate::render::{Frame, Rgb};

use super::{CELLS, SIZE};

const BACKGROUND: Rgb = [0, 0, 0];

/// `sns.color_palette("cubehelix", C)` for the games' channel counts, as the bytes
/// matplotlib draws them (`ListedColormap(["black"] + palette)(range(C + 1),
/// bytes=True)`, seaborn 0.13.2, matplotlib 3.11.2): computed once, not at run time,
/// so that rendering needs no Python.
const CUBEHELIX_4: [Rgb; 4] = [
    [21, 60, 77],
    [83, 121, 46],
    [207, 126, 146],
    [193, 202, 243],
];
const CUBEHELIX_6: [Rgb; 6] = [
    [26, 35, 65],
    [27, 97, 68],
    [104, 122, 48],
    [199, 122, 124],
    [205, 162, 224],
    [198, 225, 241],
];
const CUBEHELIX_7: [Rgb; 7] = [
    [26, 29, 59],
    [21, 83, 75],
    [67, 119, 48],
    [161, 121, 74],
    [211, 131, 169],
    [198, 180, 237],
    [203, 231, 239],
];
const CUBEHELIX_10: [Rgb; 10] = [
    [25, 18, 43],
    [23, 52, 75],
    [23, 91, 72],
    [60, 117, 50],
    [126, 122, 53],
    [187, 121, 102],
    [212, 133, 175],
    [202, 169, 230],
    [193, 210, 243],
    [213, 240, 238],
];

/// The channels' colours of a game with `channels` channels.
pub fn channel_colors(channels: usize) -> &'static [Rgb] {
    match channels {
        4 => &CUBEHELIX_4,
        6 => &CUBEHELIX_6,
        7 => &CUBEHELIX_7,
        10 => &CUBEHELIX_10,
        _ => unreachable!("no MinAtar game has {channels} channels"),
    }
}

/// The picture of an observation `[C, 10, 10]`: one pixel a cell.
pub fn observation_frame(obs: &[f32], channels: usize) -> Frame {
    let colors = channel_colors(channels);
    let mut frame = Frame::filled(SIZE, SIZE, BACKGROUND);
    for cell in 0..CELLS {
        let top = (0..channels).rev().find(|&c| obs[c * CELLS + cell] != 0.0);
        if let Some(c) = top {
            frame.set(cell % SIZE, cell / SIZE, colors[c]);
        }
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_channel_colours_a_cell() {
        let mut obs = vec![0.0f32; 4 * CELLS];
        obs[12] = 1.0; // channel 0, row 1, col 2
        obs[3 * CELLS + 12] = 1.0; // channel 3, same cell
        obs[CELLS + 99] = 1.0; // channel 1, row 9, col 9
        let f = observation_frame(&obs, 4);
        assert_eq!(f.pixel(2, 1), CUBEHELIX_4[3]);
        assert_eq!(f.pixel(9, 9), CUBEHELIX_4[1]);
        assert_eq!(f.pixel(0, 0), BACKGROUND);
    }
}
