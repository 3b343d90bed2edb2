set encoding utf8
set grid lc rgb '#dddddd'
set key noenhanced
set title noenhanced
set title 'Checkpoint duration (trigger to durable commit) by state size'
set logscale x
set logscale y
set xlabel 'keys in state'
set ylabel 'ms (log)'
set key top left
plot 'checkpoint_size.dat' index 0 using 1:2 with linespoints lw 2 title '1% changed', 'checkpoint_size.dat' index 1 using 1:2 with linespoints lw 2 title '10% changed', 'checkpoint_size.dat' index 2 using 1:2 with linespoints lw 2 title '100% changed'
