set encoding utf8
set grid lc rgb '#dddddd'
set key noenhanced
set title noenhanced
set title 'Recovery by state size'
set logscale x
set logscale y
set xlabel 'keys in state'
set ylabel 'ms after the failure (log)'
set key top left
plot 'recovery.dat' using 1:2 with linespoints lw 2 title 'first record', 'recovery.dat' using 1:3 with linespoints lw 2 title 'caught up'
